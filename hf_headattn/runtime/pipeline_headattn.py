"""The translation pipeline shipped with every saved model (Transformers 5 removed its own).

`pipeline("translation", model=folder_or_repo, trust_remote_code=True)` finds this class through the
config's `custom_pipelines`; it takes a string or a list of strings, passes generation keyword arguments to
`generate`, and returns `[{"translation_text": ...}]` (one dict per input; a list of dicts per input when
`num_return_sequences > 1`). A list is translated in batches of `DEFAULT_BATCH_SIZE` inputs sorted by token length
(so that a batch holds little padding), and the results come back in input order; `batch_size` (the pipeline's or
the call's) overrides that, batching the inputs in the order given. Empty or whitespace-only inputs translate to `""` without reaching the model (a model
would invent text for them); inputs cut by `truncation=True` are reported once per pipeline.
"""

import warnings

from transformers import GenerationConfig, Pipeline

from .seq2seq_common import check_generation_counts
from .transformers_compat import prepare_pipeline_generate_kwargs


DEFAULT_BATCH_SIZE = 32  # inputs per generate call when a list is given without batch_size


class TranslationPipeline(Pipeline):
    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_video_processor = False
    _pipeline_calls_generate = True
    _default_generation_config = GenerationConfig(max_new_tokens=256)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.tokenizer is None:
            raise ValueError("The translation pipeline needs a tokenizer; pass `tokenizer=` or save one with the model")
        model_vocab = self.model.get_input_embeddings().num_embeddings
        if len(self.tokenizer) > model_vocab:
            raise ValueError(
                f"Tokenizer has {len(self.tokenizer)} tokens but the model's vocabulary has {model_vocab}; they do "
                "not belong together (use the tokenizer the model was trained with, or resize_token_embeddings)"
            )

    def _sanitize_parameters(self, truncation=None, max_input_length=None, clean_up_tokenization_spaces=None,
                             **generate_kwargs):
        preprocess_params = {}
        if truncation is not None:
            preprocess_params["truncation"] = truncation
        if max_input_length is not None:
            preprocess_params["max_length"] = max_input_length
        postprocess_params = {}
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess_params, generate_kwargs, postprocess_params

    def __call__(self, inputs, **kwargs):
        # before any input is tokenised (the call's settings, else the pipeline's, else the model's)
        pipeline_config = getattr(self, "generation_config", self.model.generation_config)  # before 5.20: its settings
        check_generation_counts(pipeline_config, {**getattr(self, "_generate_kwargs", {}), **kwargs})
        if isinstance(inputs, str):
            return super().__call__(inputs, **kwargs) if inputs.strip() else self._empty(kwargs)
        if not isinstance(inputs, (list, tuple)):
            raise TypeError(f"The translation pipeline takes a string or a list of strings, got {type(inputs).__name__}")
        for position, text in enumerate(inputs):
            if not isinstance(text, str):
                raise TypeError(f"The translation pipeline takes a string or a list of strings, got "
                                f"{type(text).__name__} at position {position}")
        texts = [text for text in inputs if text.strip()]
        order = list(range(len(texts)))
        if texts and kwargs.get("batch_size") is None and self._batch_size is None:
            lengths = [len(ids) for ids in self.tokenizer(texts, return_token_type_ids=False)["input_ids"]]
            order.sort(key=lambda index: -lengths[index])
            kwargs["batch_size"] = DEFAULT_BATCH_SIZE
        translated = super().__call__([texts[index] for index in order], **kwargs) if texts else []
        in_input_order = [None] * len(texts)
        for index, translation in zip(order, translated):
            in_input_order[index] = translation
        translations = iter(in_input_order)
        results = [next(translations) if text.strip() else self._empty(kwargs) for text in inputs]
        return [result[0] if len(result) == 1 else result for result in results]

    def _empty(self, kwargs: dict) -> list[dict]:
        """An empty input's translation: `""`, once per requested sequence."""
        # the call's setting, else the pipeline's (Transformers >= 5.20 keeps it in `_generate_kwargs`, older
        # releases in `generation_config`), else the model's
        pipeline_config = getattr(self, "generation_config", self.model.generation_config)
        sequences = (kwargs.get("num_return_sequences")
                     or getattr(self, "_generate_kwargs", {}).get("num_return_sequences")
                     or pipeline_config.num_return_sequences or 1)
        return [{"translation_text": ""} for _ in range(sequences)]

    def preprocess(self, text: str, truncation: bool = False, max_length: int | None = None):
        # no token_type_ids: Transformers 4.x's fast tokenizers return them by default, and the model takes none
        encoded = self.tokenizer(text, return_tensors="pt", return_token_type_ids=False)
        limit = max_length if max_length is not None else self.tokenizer.model_max_length
        if truncation and encoded["input_ids"].shape[1] > limit:  # tokenised again only when it must be cut
            full_length = encoded["input_ids"].shape[1]
            encoded = self.tokenizer(text, return_tensors="pt", truncation=True, max_length=max_length,
                                     return_token_type_ids=False)
            if not getattr(self, "_warned_truncation", False):
                self._warned_truncation = True
                warnings.warn(f"Input of {full_length} tokens truncated to {encoded['input_ids'].shape[1]} "
                              "(truncation=True); later truncations by this pipeline are not reported", stacklevel=2)
        return encoded

    def _forward(self, model_inputs, **generate_kwargs):
        generate_kwargs = prepare_pipeline_generate_kwargs(self, generate_kwargs)
        batch_size = model_inputs["input_ids"].shape[0]
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)
        # [batch, return sequences, length], so that batching splits per input and keeps its sequences together
        return {"output_ids": output_ids.reshape(batch_size, -1, output_ids.shape[-1])}

    def postprocess(self, model_outputs, clean_up_tokenization_spaces: bool = False):
        return [
            {
                "translation_text": self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            }
            for ids in model_outputs["output_ids"][0]
        ]

"""Registers the two model families with Transformers' Auto classes, so `AutoConfig.for_model("headattn")`,
`AutoModelForSeq2SeqLM.from_config(config)` and `from_pretrained(folder)` without `trust_remote_code` resolve
to the classes of this process. Importing this module does it; `hf_headattn` imports it on the first access to
a model class, and the tools that load or train models import it themselves."""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .runtime.configuration_headattn import HeadAttnConfig
from .runtime.configuration_headattn_rnn import HeadAttnRNNConfig
from .runtime.modeling_headattn import HeadAttnForConditionalGeneration, HeadAttnModel
from .runtime.modeling_headattn_rnn import HeadAttnRNNForConditionalGeneration, HeadAttnRNNModel

AutoConfig.register(HeadAttnConfig.model_type, HeadAttnConfig, exist_ok=True)
AutoModel.register(HeadAttnConfig, HeadAttnModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(HeadAttnConfig, HeadAttnForConditionalGeneration, exist_ok=True)
AutoConfig.register(HeadAttnRNNConfig.model_type, HeadAttnRNNConfig, exist_ok=True)
AutoModel.register(HeadAttnRNNConfig, HeadAttnRNNModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(HeadAttnRNNConfig, HeadAttnRNNForConditionalGeneration, exist_ok=True)

"""Registers the two model families with Transformers' Auto classes, so `AutoConfig.for_model("headattn")`,
`AutoModelForSeq2SeqLM.from_config(config)` and `from_pretrained(folder)` without `trust_remote_code` resolve
to the classes of this process. Importing this module does it; `hf_headattn` imports it on the first access to
a model class, and the tools that load or train models import it themselves."""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .runtime.configuration_headattn import HeadAttnConfig
from .runtime.configuration_headattn_rnn import HeadAttnRNNConfig
from .runtime.modeling_headattn import HeadAttnForConditionalGeneration, HeadAttnModel
from .runtime.modeling_headattn_rnn import HeadAttnRNNForConditionalGeneration, HeadAttnRNNModel

# the package's model families, each a config class and its models; tooling that needs "a config of this package"
# asks here rather than naming model types
FAMILIES = {
    HeadAttnConfig: (HeadAttnModel, HeadAttnForConditionalGeneration),
    HeadAttnRNNConfig: (HeadAttnRNNModel, HeadAttnRNNForConditionalGeneration),
}
CONFIG_CLASSES = tuple(FAMILIES)

for config_class, (base_model_class, seq2seq_class) in FAMILIES.items():
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    AutoModel.register(config_class, base_model_class, exist_ok=True)
    AutoModelForSeq2SeqLM.register(config_class, seq2seq_class, exist_ok=True)

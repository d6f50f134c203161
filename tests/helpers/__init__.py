"""What the tests share, one module a kind: random models of both families and their inputs (`models`), tiny trained
folders (`runs`), the checkout's paths and scripts (`scripts`), a local port (`network`), a stand-in Hub (`hub`), the console commands (`commands`).
Test modules import from here, never from each other."""

from .commands import COMMANDS  # noqa: F401
from .hub import FakeHfApi  # noqa: F401
from .models import (EOS, PAD, RNN_CONFIGS, RNN_EOS_BIAS, TRANSFORMER_VARIANTS, VARIANT_CONFIGS, VOCAB,  # noqa: F401
                     random_model, random_rnn_model, rnn_config, source_batch, tiny_config)
from .network import free_port  # noqa: F401
from .runs import FAMILIES, N_TEST, N_TRAIN, file_flags, toy_data, train_tiny_model  # noqa: F401
from .scripts import MULTI30K, REPO, WITHOUT_PACKAGE, load_example, load_script  # noqa: F401

TRANSFORMERS_RELEASES = ("4.57.6", "5.0.0", "5.9.0", "5.19.0", "5.23.0", "5.24.0")  # the releases the code runs on

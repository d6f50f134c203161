"""What makes a saved model load where this package is not installed.

Each config and model class is registered for its auto class (`register_for_auto_class`), so Transformers'
`save_pretrained` copies the class's module and every module it imports relatively (`custom_object_save`) and
records the entry in `config.json`'s `auto_map`. `check_code_travels` runs first, so that a class whose code is
incomplete (a remote-code copy missing a module) fails before anything is written.
"""

import sys

from transformers.dynamic_module_utils import get_relative_import_files


def check_code_travels(cls: type) -> None:
    """Raise FileNotFoundError, before any file is written, if a module that `cls`'s module imports is missing."""
    module_file = sys.modules[cls.__module__].__file__
    try:
        get_relative_import_files(module_file)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"Cannot save {cls.__name__}: its module {module_file} imports {error.filename}, which is missing, so the "
            "saved folder could not load through trust_remote_code. Load the model from a complete folder (or "
            "install hf_headattn) and save again."
        ) from error

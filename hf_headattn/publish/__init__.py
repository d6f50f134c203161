"""Publishing saved model folders: model cards (:mod:`.cards`) and their upload to the Hub (:mod:`.upload`).

``from hf_headattn.publish import write_model_card, push_to_hub``; a Gradio Space of the web page is
:mod:`hf_headattn.app.space`, and the command is ``hf-headattn-hub`` (:mod:`hf_headattn.commands.hub`).

Tooling, not model runtime: never copied into a checkpoint.
"""

from .cards import CARD_METRICS, TEMPLATES_DIR, load_config, markdown_table_cell, write_model_card
from .upload import (
    UPLOADED_FILES,
    check_model_folder,
    files_left_out,
    files_to_upload,
    links_out_of,
    missing_code_files,
    needed_code_files,
    push_to_hub,
    secrets_in,
    upload_checked_files,
)

__all__ = [
    "CARD_METRICS",
    "TEMPLATES_DIR",
    "UPLOADED_FILES",
    "check_model_folder",
    "files_left_out",
    "files_to_upload",
    "links_out_of",
    "load_config",
    "markdown_table_cell",
    "missing_code_files",
    "needed_code_files",
    "push_to_hub",
    "secrets_in",
    "upload_checked_files",
    "write_model_card",
]

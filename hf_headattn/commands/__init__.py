"""The console commands: one thin module each (parse the flags, call the library, print the result).

Each is a console script (`hf-headattn-<name>`, pyproject.toml) and `python -m hf_headattn.commands.<name>`.
"""

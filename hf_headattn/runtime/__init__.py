"""The model runtime: everything a saved model needs to run through `trust_remote_code`.

These modules travel with every checkpoint, so they import each other only relatively (`from .module import
Name`) and depend on nothing but torch and transformers. `save_pretrained` copies the modules a saved model
imports, found by Transformers' own `custom_object_save`; this `__init__.py` is never copied.
"""

"""The training library's private helpers, kept apart from its public names.

The public modules (``higgsfield.experiment``, ``.llama``, ``.loaders``,
``.dataset``, ``.checkpoint``, ``.training``, ``.metrics``) are what user code
imports; what they lean on lives here: the checkpoint mirror, DeepSpeed's
engine, the Hugging Face model, metadata and export, and the tokenizer.
Nothing here is an API: names may change between releases.
"""

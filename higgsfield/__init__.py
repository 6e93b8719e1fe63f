"""higgsfield: multi-node LLM training without crying.

The control side (this package minus the training library) never imports torch,
so ``higgsfield --help`` stays instant on a laptop. Training code lives in
``higgsfield.experiment``, ``higgsfield.llama``, ``higgsfield.loaders``,
``higgsfield.dataset``, ``higgsfield.checkpoint`` and ``higgsfield.training``.
"""

__version__ = "0.1.0"

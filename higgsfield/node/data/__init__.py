"""Data entries on a node: the object store and versions (store), node-to-node copies (peer), downloads
(sources), and the ``invoker data`` verbs (cli)."""

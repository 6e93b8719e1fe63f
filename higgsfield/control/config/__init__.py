"""The typed model of ``higgsfield.yml`` and its loader.

Every field is typed and documented; unknown keys are refused. Any problem is
reported as one :class:`~higgsfield.contract.errors.ConfigError` line naming the file, the
line and the field, for example::

    higgsfield.yml:7: nodes[1].port: must be between 1 and 65535 (got 70000)

The rooms: :mod:`.schema` (the typed model and its field checks), :mod:`.blocks` (its smaller
blocks: docker, install, retention, checkpoint, notify), :mod:`.slurm` (the
``slurm:`` block, which the Slurm backend uses as it is), :mod:`.fields` (the field types
both share), :mod:`.loader`
(the file, its text, one YAML parse with line numbers) and :mod:`.diagnostics`
(a validation error said as one line). This package re-exports the public names.

Use::

    cfg = load_config()              # ./higgsfield.yml, or the nearest one above
    cfg.nodes[0].host, cfg.project_dir
"""

from higgsfield.contract.names import LOCAL_HOSTS, NAME_RE, SECRET_RE
from higgsfield.control.config.loader import (
    MAX_CONFIG_BYTES,
    MAX_YAML_NODES,
    decode_text,
    find_config,
    load_config,
    parse_config,
    read_config_text,
)
from higgsfield.control.config.schema import (
    CONFIG_FILE,
    Config,
    DockerConfig,
    InstallConfig,
    NodeConfig,
    SSHConfig,
    json_schema,
)

__all__ = ["CONFIG_FILE", "LOCAL_HOSTS", "MAX_CONFIG_BYTES", "MAX_YAML_NODES", "NAME_RE", "SECRET_RE", "Config",
           "DockerConfig", "InstallConfig", "NodeConfig", "SSHConfig", "decode_text", "find_config", "json_schema",
           "load_config", "parse_config", "read_config_text"]

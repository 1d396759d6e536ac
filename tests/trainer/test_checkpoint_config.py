"""`checkpoint:` section: upstream field names, defaults and error messages."""
import pytest

from mindformers_core.config import ConfigError
from mindformers_core.config.checkpoint import CheckpointConfig


def test_defaults_and_field_names():
    c = CheckpointConfig.from_dict({}, "checkpoint")
    assert c.to_dict() == {"enable_save": False, "save_path": None, "save_max": 3,
                           "save_interleaved_steps": 1000, "keep_steps": None,
                           "no_save_optim": False,
                           "load_path": None, "no_load_optim": False, "load_format": "auto",
                           "prefix": "mindformers_core", "async_save": False,
                           "remove_redundancy": False, "load_balanced": False,
                           "load_worker_number": 1, "save_global_layout_cache": True,
                           "reshard_worker_num": 1}
    # upstream's spellings of "none" / "default" (issue [7/10])
    up = CheckpointConfig.from_dict({"load_path": "", "save_path": "", "prefix": None}, "c")
    assert (up.load_path, up.save_path, up.prefix) == (None, None, "mindformers_core")


@pytest.mark.parametrize("data, message", [
    ({"save_max": 0}, r"checkpoint.save_max: must be >= 1, got 0"),
    ({"save_interleaved_steps": 0}, r"checkpoint.save_interleaved_steps: must be >= 1, got 0"),
    ({"prefix": "a/b"}, r"checkpoint.prefix: must be a non-empty file name prefix"),
    ({"prefix": ""}, r"checkpoint.prefix: must be a non-empty file name prefix"),
    ({"save_every": 5}, r"checkpoint.save_every: unknown key"),
    ({"enable_save": "yes"}, r"checkpoint.enable_save: expected a bool"),
    ({"keep_steps": [10, 0]}, r"checkpoint.keep_steps\[1\]: must be >= 1, got 0"),
])
def test_errors(data, message):
    with pytest.raises(ConfigError, match=message):
        CheckpointConfig.from_dict(data, "checkpoint")

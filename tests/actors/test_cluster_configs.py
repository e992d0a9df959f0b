"""The shipped `ray up` cluster files pass Ray's own cluster-config validation (offline)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["cluster-local.yaml", "cluster-aws.yaml"])
def test_cluster_yaml_is_valid_for_ray_up(name: str) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((ROOT / "configs" / name).read_text())
    validate_config(prepare_config(config))


def test_validation_rejects_an_unknown_key() -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((ROOT / "configs" / "cluster-local.yaml").read_text())
    config["not_a_ray_key"] = 1
    with pytest.raises(Exception, match="not_a_ray_key"):
        validate_config(prepare_config(config))

"""Fixtures of the remote tests: two unrelated trial CAs made in a temporary directory."""

from __future__ import annotations

import pytest

from dpmarket.actors.remote import tls
from tests.remote.echo import Certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    main = tmp_path_factory.mktemp("certs")
    other = tmp_path_factory.mktemp("other-ca")
    tls.write_party_certs(main, ["owner-1", "owner-2"], ["node-1"])
    tls.write_party_certs(other, ["owner-1"], ["node-1"])
    return Certs(main, other)

"""``dpmarket certs init DIR``: a throwaway CA and a key and certificate per party, for trials.

``dpmarket certs init DIR --owners owner-1,owner-2 --nodes node-1,node-2,node-3
[--market-host HOST ...] [--days N]`` writes ``ca.crt`` and ``ca.key``, ``market.crt`` and
``market.key`` (valid for each ``--market-host``, default 127.0.0.1 and localhost), and
``NAME.crt`` and ``NAME.key`` for every owner and compute node, then ``fingerprints.toml``
(party = "sha256:...", to paste into the market's config). For a trial on one machine it
also makes each compute node's X25519 key (``NAME.x25519``, what ``dpmarket node serve`` uses)
and ``node-keys.toml`` (node = SHA-256 of its public key, what owners pin in ``[nodes]``); in
production each node makes its own key on its machine and hands the line that
``dpmarket node fingerprint NODE.toml`` prints to the owners. Keys are created with mode 0600;
no existing file is ever overwritten (exit 2 naming it). The CA key is written beside the
certificates it signed: fine for a trial on one machine, not for production, where operators
bring their own PKI and each party keeps its own key (see actors/remote/tls.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dpmarket.actors.config.checks import ConfigError
from dpmarket.actors.remote.tls import MARKET, write_party_certs

__all__ = ["add_certs_parser"]

DEFAULT_MARKET_HOSTS = ("127.0.0.1", "localhost")


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _node_key(path: Path) -> str:
    from dpmarket.actors.remote.nodeagent import node_key
    from dpmarket.protocol.securesum.sealing import key_fingerprint

    if path.exists():  # never overwritten (write_party_certs refused the directory anyway)
        raise ConfigError(f"{path}: already exists; refusing to overwrite it")
    return key_fingerprint(node_key(str(path)).public_key().public_bytes_raw())


def _init(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    hosts = tuple(args.market_host) if args.market_host else DEFAULT_MARKET_HOSTS
    found = write_party_certs(directory, _names(args.owners), _names(args.nodes), hosts, args.days)
    print(f"trial CA: {directory / 'ca.crt'} (its key {directory / 'ca.key'})")
    for party, value in found.items():
        where = f" for {', '.join(hosts)}" if party == MARKET else ""
        print(f"{party}: {directory / (party + '.crt')}, key {directory / (party + '.key')}{where}")
        print(f"  {value}")
    print(f"fingerprints: {directory / 'fingerprints.toml'}")
    pins = [
        f'"{node}" = "{_node_key(directory / f"{node}.x25519")}"' for node in _names(args.nodes)
    ]
    if pins:
        (directory / "node-keys.toml").write_text(
            "# SHA-256 of each compute node's X25519 public key, for owners' [nodes] pins\n"
            + "\n".join(pins)
            + "\n",
            encoding="utf-8",
        )
        print(
            f"compute nodes' X25519 keys: NAME.x25519; owners' pins: {directory / 'node-keys.toml'}"
        )
    print(
        "This CA is for trials: its key sits beside the certificates. In production each "
        "organisation brings its own PKI, keeps its own key and exchanges only certificates "
        "and fingerprints."
    )
    return 0


def add_certs_parser(sub: Any) -> None:
    cmd = sub.add_parser(
        "certs",
        help="certificates for remote owners and compute nodes (trials)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = cmd.add_subparsers(dest="certs_command", required=True)
    init = actions.add_parser("init", help="write a throwaway CA and one key and cert per party")
    init.add_argument("directory", metavar="DIR")
    init.add_argument("--owners", default="", metavar="NAME,...", help="owners' names")
    init.add_argument("--nodes", default="", metavar="NAME,...", help="compute nodes' names")
    init.add_argument(
        "--market-host",
        action="append",
        default=[],
        metavar="HOST",
        help="an address or name agents dial the market by (repeatable; "
        "default 127.0.0.1 and localhost)",
    )
    init.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    init.set_defaults(func=_init)

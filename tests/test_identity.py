"""The identity key (a peer's private RSA key): never readable by others, not even while it is created;
an existing one that others may read is refused, with the fix, as ssh refuses such a key."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from swarm_node.cli import main
from swarm_node.errors import UserFacingError
from swarm_node.swarm import records
from swarm_node.swarm.dht import ensure_identity, write_identity


@pytest.fixture
def open_umask():
    """umask 0: whatever a writer does not restrict itself is readable by everyone."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_a_new_identity_is_never_readable_by_others_even_for_a_moment(tmp_path, open_umask, monkeypatch):
    """Every file-system step of the creation is watched (the calls go through unchanged): the key's name
    never points at a file that group or others may read. hivemind's writer opened it 0666 & ~umask, wrote
    the key, and only then chmod-ed it 0400."""
    path = tmp_path / "keys" / "id.key"
    seen: list[tuple[str, int]] = []

    def watch(name: str):
        real = getattr(os, name)

        def call(*args, **kwargs):
            for when in ("before", "after"):
                if when == "after":
                    out = real(*args, **kwargs)
                if path.exists():
                    seen.append((f"{when} os.{name}", stat.S_IMODE(path.stat().st_mode)))
                for a in args:  # a temporary file named by the call must be private too
                    if isinstance(a, str | Path) and Path(a).is_file() and Path(a).parent == path.parent:
                        seen.append((f"{when} os.{name} on {Path(a).name}", stat.S_IMODE(Path(a).stat().st_mode)))
            return out
        monkeypatch.setattr(os, name, call)

    for name in ("chmod", "fchmod", "link", "replace", "rename", "fsync", "close", "unlink"):
        watch(name)
    _path, _tmp, created = ensure_identity(str(path))
    monkeypatch.undo()
    assert created and seen, seen
    assert all(mode & 0o077 == 0 for _, mode in seen), seen
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    assert [p.name for p in path.parent.iterdir()] == ["id.key"]  # no temporary file left
    # the key is a libp2p identity: hivemind derives the same peer id from it as our records do
    from hivemind.p2p import PeerID

    key = records.load_identity_key(str(path))
    assert records.peer_id_of_subkey(records.subkey_for(key)) == PeerID.from_identity(path.read_bytes()).to_base58()


def test_a_key_made_meanwhile_by_another_process_is_kept(tmp_path):
    path = tmp_path / "id.key"
    assert write_identity(path)
    first = path.read_bytes()
    assert not write_identity(path)  # lost the race: the key already there stands
    assert path.read_bytes() == first and [p.name for p in tmp_path.iterdir()] == ["id.key"]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o440])
def test_an_existing_key_that_others_may_read_is_refused_with_the_fix(tmp_path, mode):
    path = tmp_path / "id.key"
    write_identity(path)
    os.chmod(path, mode)
    with pytest.raises(UserFacingError, match=rf"mode {mode:04o}.*chmod 600 {path}"):
        ensure_identity(str(path))


@pytest.mark.parametrize("mode", [0o400, 0o600])
def test_an_existing_private_key_is_used(tmp_path, mode):
    path = tmp_path / "id.key"
    write_identity(path)
    os.chmod(path, mode)
    assert ensure_identity(str(path))[2] is False


def test_run_refuses_an_open_key_before_loading_the_model(tmp_path, capsys):
    """`swarm-node run` says it in one line, exit 2, before the model loads (model.path is not a model)."""
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    key = tmp_path / "id.key"
    write_identity(key)
    os.chmod(key, 0o644)
    rc = main(["run", "--state-dir", str(tmp_path / "s"), "--set", f"model.path={not_a_model}", "--set", "rounds=1",
               "--set", "swarm.enabled=true", "--set", f"swarm.identity_path={key}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "mode 0644" in err and f"chmod 600 {key}" in err, err

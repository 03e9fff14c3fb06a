"""API keys with roles: ``KEY TENANT [admin]`` lines and ``KEY:TENANT[:admin]`` in the
environment; who a call's metadata says it is."""

from __future__ import annotations

import pytest

from router.gateway.auth import ApiKeys, Caller, Unauthenticated


def test_file_and_environment_give_tenants_and_admins(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# key tenant [admin]\nk1 acme\nk2 ops admin  # the operators\n\n")
    keys = ApiKeys.load(str(path), env="k3:globex,k4:root:admin")
    assert keys.callers == {
        "k1": Caller("acme"),
        "k2": Caller("ops", admin=True),
        "k3": Caller("globex"),
        "k4": Caller("root", admin=True),
    }
    assert keys.caller_of((("authorization", "Bearer k2"),)) == Caller("ops", admin=True)
    assert keys.caller_of((("x-api-key", "k3"),)) == Caller("globex")
    for metadata in ((), (("authorization", "Bearer nope"),)):
        with pytest.raises(Unauthenticated):
            keys.caller_of(metadata)


def test_without_keys_every_caller_is_an_admin():
    keys = ApiKeys.load(None, env="")
    assert not keys.enabled
    assert keys.caller_of(()) == Caller("", admin=True)


@pytest.mark.parametrize(
    "line, env",
    [
        ("k1 acme root", ""),
        ("k1", ""),
        ("k1 acme admin extra", ""),
        ("", "k1:acme:root"),
        ("", "k1"),
        ("", "k1:acme:admin:x"),
    ],
)
def test_malformed_keys_are_refused_with_the_format(tmp_path, line, env):
    path = tmp_path / "keys"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match="admin"):
        ApiKeys.load(str(path), env=env)

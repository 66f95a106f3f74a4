from __future__ import annotations

from pathlib import Path

import pytest

from execstate.identity.tenant import LOCAL_TENANT
from execstate.serve.principals import DEFAULT_TENANT, KeyRing


def test_open_server_is_the_local_tenant() -> None:
    ring = KeyRing.build()
    assert ring.open and ring.tenant_of(None) == LOCAL_TENANT and ring.tenant_of("anything") == LOCAL_TENANT


def test_keys_and_file(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text(
        "# key tenant\nsk-alpha-0001 team-a\n\nsk-beta-00002   team-b  # trailing comment\nsk-alpha-0003 team-a\n"
    )
    ring = KeyRing.build(["sk-solo-key-1"], f)
    assert ring.tenant_of("sk-alpha-0001") == ring.tenant_of("sk-alpha-0003") == "team-a"
    assert ring.tenant_of("sk-beta-00002") == "team-b"
    assert ring.tenant_of("sk-solo-key-1") == DEFAULT_TENANT
    for wrong in (None, "", "sk-alpha-000", "sk-alpha-00011", "team-a"):
        assert ring.tenant_of(wrong) is None
    assert ring.tenants == ["default", "team-a", "team-b"]
    assert "sk-alpha" not in repr(ring)


@pytest.mark.parametrize("text,match", [
    ("onlykey-xxxx\n", ":1: expected 'KEY TENANT'"),
    ("sk-0000001 bad/tenant\n", ":1: a tenant name"),
    ("short t\n", ":1: an API key is"),
    ("sk-0000001 a\nsk-0000001 b\n", ":2: this key is already given for tenant 'a'"),
])
def test_malformed_files_name_the_line(tmp_path: Path, text: str, match: str) -> None:
    f = tmp_path / "keys"
    f.write_text(text)
    with pytest.raises(ValueError, match=match):
        KeyRing.build(None, f)

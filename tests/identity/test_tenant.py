from __future__ import annotations

import pytest

from execstate.identity.tenant import LOCAL_TENANT, tenant_id


def test_tenant_names() -> None:
    assert tenant_id("team-a") == "team-a" and tenant_id("A.b_9") == "A.b_9"
    assert LOCAL_TENANT == "local"
    for bad in ("", "-a", "a b", "a/b", "x" * 65, "é", 7, None, "key=secret"):
        with pytest.raises(ValueError, match="tenant name"):
            tenant_id(bad)

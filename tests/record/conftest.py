"""Every `wai policy` / `wai record` these tests start takes ``Started``'s token; the clients in this process
read it from ``$WAI_TOKEN`` (the ``wai_token`` fixture), as a user's would."""

import pytest


@pytest.fixture(autouse=True)
def _token(wai_token: str) -> str:
    return wai_token

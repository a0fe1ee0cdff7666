"""Schemathesis against the OpenAPI schema of a real `swarmtune serve` on a loopback port.

The step stream is left out (an endless stream is not a request-response operation); its contract is
tested in test_remote.py."""

import pytest
import schemathesis
from hypothesis import settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.conftest import SIM
from tests.remote_helpers import served


@pytest.fixture(scope="module")
def api_schema():
    with served("--sim", SIM) as s:
        yield schemathesis.openapi.from_url(s.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema").exclude(path="/v1/steps")


@schema.parametrize()
@settings(max_examples=25, deadline=None)
def test_api_conforms(case):
    # A batch cap above the agent count is valid by the schema alone but not by the engine: a 422
    # naming batch_cap is the intended answer, so that one check is not applied.
    case.call_and_validate(excluded_checks=[positive_data_acceptance])

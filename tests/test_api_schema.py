"""Schemathesis against the service's own OpenAPI document (a bounded number of cases).

Every operation except the endless SSE stream is called with generated valid and invalid data:
no answer may be a 5xx, every status code must be documented, and documented response bodies
must match their schema (the error bodies included). Path ids are pointed at a real dataflow so that the calls reach the
tracker rather than stopping at 404 (``DELETE`` at one of its own).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers import ServiceProcess, loop_graph, register

pytestmark = pytest.mark.service

MAX_EXAMPLES = 15


@pytest.fixture(scope="module")
def server(service: ServiceProcess) -> tuple[ServiceProcess, str, str]:
    """The module's service, with a registered dataflow for the path ids, and another one for
    ``DELETE`` (which would otherwise turn every later call on the first into a 410)."""
    dataflow_id, _ = register(service, loop_graph(operators=3, arity=2))
    doomed, _ = register(service, loop_graph(operators=3, arity=2))
    return service, dataflow_id, doomed


def test_openapi_conformance(server: tuple[ServiceProcess, str, str]) -> None:
    proc, dataflow_id, doomed = server
    schema = schemathesis.openapi.from_url(f"{proc.url}/openapi.json").exclude(path_regex=r".*/stream$")
    # Not negative_data_rejection: unknown query parameters are ignored by design (as HTTP APIs
    # commonly do), which that check counts as accepting invalid data.
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    tested: list[str] = []
    statuses: dict[int, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            tested.append(f"{operation.label} {mode.value}")

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                      database=None)
            def run(case: schemathesis.Case) -> None:
                if case.path_parameters and "id" in case.path_parameters:
                    case.path_parameters["id"] = doomed if case.method.upper() == "DELETE" else dataflow_id
                response = case.call_and_validate(base_url=proc.url, headers=proc.admin_headers, checks=checks)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
                assert mode is GenerationMode.NEGATIVE, operation.label
                tested.pop()
    assert len(tested) >= 14, tested
    print(f"schemathesis: {sum(statuses.values())} calls over {len(tested)} operation/mode pairs; statuses {statuses}")
    assert sum(statuses.values()) >= 100
    assert all(code < 500 for code in statuses)
    assert any(200 <= code < 300 for code in statuses) and any(400 <= code < 500 for code in statuses)

"""GET/HEAD /metrics: the format the scraper asks for (OpenMetrics 1.0 or the
Prometheus text format 0.0.4), request latency exemplars carrying the trace id,
checked by promtool and prometheus-client's OpenMetrics parser."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def _promtool_check(body: bytes, *, lint: bool = True) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool not installed (Debian: apt-get install prometheus; scripts/install.sh "
            "does it as root): the exposition was not checked by promtool"
        )
    done = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, timeout=30
    )
    # Exit 1 with "error while linting": the body did not parse; 3: lint problems.
    assert b"error while linting" not in done.stderr, done.stderr.decode()
    if lint:
        assert done.returncode == 0, done.stderr.decode()


async def test_openmetrics_is_negotiated_with_trace_exemplars(client: httpx.AsyncClient) -> None:
    trace_id = uuid.uuid4().hex
    traced = await client.get("/healthz", headers={"traceparent": f"00-{trace_id}-{'1' * 16}-01"})
    assert traced.status_code == 200

    scraped = await client.get("/metrics", headers={"Accept": "application/openmetrics-text"})

    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("application/openmetrics-text; version=1")
    text = scraped.text
    assert text.endswith("# EOF\n")
    exemplars = [
        s.exemplar
        for family in text_string_to_metric_families(text)  # raises on invalid OpenMetrics
        if family.name == "reservo_http_request_seconds"
        for s in family.samples
        if s.labels.get("route") == "/healthz" and s.exemplar is not None
    ]
    assert any(e.labels == {"trace_id": trace_id} for e in exemplars), text


async def test_prometheus_text_stays_the_default(client: httpx.AsyncClient) -> None:
    for accept in (None, "text/plain", "*/*"):
        headers = {} if accept is None else {"Accept": accept}
        scraped = await client.get("/metrics", headers=headers)
        assert scraped.status_code == 200
        assert scraped.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert "# EOF" not in scraped.text
        assert "reservo_http_request_seconds_bucket" in scraped.text
        _promtool_check(scraped.content)


async def test_openmetrics_parses_in_promtool(client: httpx.AsyncClient) -> None:
    # promtool (2.x, 3.x) `check metrics` reads the 0.0.4 text grammar only: it
    # cannot read an exemplar, and its lint wants a counter's HELP under the
    # sample's name (OpenMetrics names the family without _total). So here it
    # parses the body without exemplars; the OpenMetrics grammar itself is
    # checked by prometheus-client's strict parser (the test above).
    await client.get("/healthz", headers={"traceparent": f"00-{uuid.uuid4().hex}-{'2' * 16}-01"})
    scraped = await client.get("/metrics", headers={"Accept": OPENMETRICS})
    assert b" # {trace_id=" in scraped.content
    body = b"\n".join(line.split(b" # {")[0] for line in scraped.content.split(b"\n"))
    list(text_string_to_metric_families(scraped.text))
    _promtool_check(body, lint=False)


async def test_head_answers_the_headers_of_get(client: httpx.AsyncClient) -> None:
    for accept in ("text/plain", "application/openmetrics-text"):
        head = await client.head("/metrics", headers={"Accept": accept})
        get = await client.get("/metrics", headers={"Accept": accept})
        assert head.status_code == 200
        assert head.content == b""
        assert head.headers["content-type"] == get.headers["content-type"]


def test_multiprocess_mode_negotiates_without_exemplars(tmp_path: object) -> None:
    # `reservo api --workers N` sets PROMETHEUS_MULTIPROC_DIR before the workers
    # import anything: a fresh interpreter, as a worker is.
    script = textwrap.dedent(
        """
        from reservo.core.http.request_metrics import REQUEST_METRICS
        from reservo.core.kernel import metrics, tracing

        assert metrics.MULTIPROCESS
        with tracing.span("GET", "server"):
            REQUEST_METRICS.observe("GET", "/healthz", 200, 10.0, 10.003)
        body, media = metrics.render("application/openmetrics-text")
        assert media.startswith("application/openmetrics-text"), media
        assert body.endswith(b"# EOF\\n"), body[-40:]
        line = next(
            l for l in body.decode().splitlines()
            if l.startswith('reservo_http_request_seconds_bucket{') and '/healthz' in l
            and 'le="0.005"' in l
        )
        assert line.endswith(" 1.0") and " # {" not in line, line
        text, media = metrics.render(None)
        assert media == "text/plain; version=0.0.4; charset=utf-8" and b"# EOF" not in text
        print("ok")
        """
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr

"""Submitting a batch over edgeloop's HTTP API (``POST /v1/rollouts``), with the standard library only."""

import json
import os
import urllib.error
import urllib.request

__all__ = ["EdgeloopHTTPError", "submit"]


class EdgeloopHTTPError(Exception):
    """An error answer of the edgeloop API: ``{error: {code, message, field?}}``.

    Attributes: ``status`` (HTTP status), ``code`` (e.g. ``invalid_input``,
    ``conflict``, ``unauthorized``), ``message``, ``field`` (the request field
    at fault for a 400, else None), ``retry_after`` (seconds, for a 503).
    """

    def __init__(self, status, code, message, field=None, retry_after=None):
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after


def submit(url, rows, config=None, token=None, global_steps=None, model_version=None, validate=False, timeout=60.0):
    """Submits a batch of dataset rows; returns the API's answer as a dict.

    ``url``: the edgeloop API's base URL (``http://host:8787``; a trailing
    ``/`` is fine). ``rows``: a non-empty list of verl-style dataset rows
    (dicts with ``prompt``, ``data_source``, ``reward_model``, ``extra_info``…).
    ``config``: an optional per-batch config override (the ``rollout`` section
    and friends, as the YAML config). ``token``: the API's bearer token, when
    it has one; None (the default) reads the environment variable
    ``EDGELOOP_API_TOKEN`` as the CLI does (unset or empty: no token is sent).
    ``global_steps``,
    ``model_version``, ``validate``: recorded with the batch (``validate``
    sends the groups to the ``val`` partition).

    Returns ``{"batch_id": str, "keys": [str], "reused_uids": [str], "complete_uids": [str]}``
    (HTTP 202). Raises :class:`EdgeloopHTTPError` for an error answer (400
    naming the field, 401, 409, 413, 503 with ``retry_after``), and
    ``urllib.error.URLError`` when the API cannot be reached.
    """
    if not isinstance(rows, (list, tuple)) or not rows:
        raise ValueError("rows must be a non-empty list of dataset rows")
    body = {"rows": list(rows)}
    if config is not None:
        body["config"] = config
    if global_steps is not None:
        body["global_steps"] = global_steps
    if model_version is not None:
        body["model_version"] = model_version
    if validate:
        body["validate"] = True
    headers = {"content-type": "application/json", "accept": "application/json"}
    if token is None:
        token = os.environ.get("EDGELOOP_API_TOKEN")
    if token:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url.rstrip("/") + "/v1/rollouts", data=json.dumps(body).encode("utf-8"), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            return json.loads(res.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        raw = e.read().decode("utf-8", "replace")
        try:
            err = json.loads(raw).get("error") or {}
        except (ValueError, AttributeError):
            err = {}
        retry = e.headers.get("retry-after") if e.headers else None
        raise EdgeloopHTTPError(
            e.code,
            err.get("code", "http_error"),
            err.get("message", raw[:500] or e.reason),
            err.get("field"),
            float(retry) if retry else None,
        ) from None

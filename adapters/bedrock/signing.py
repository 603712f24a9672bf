"""SigV4 for Bedrock with botocore's signer: the gateway signs, the demo upstream verifies.

Signing is pure given the credentials (resolved and refreshed off the event loop by the extproc)
and the clock. The service's signing name is `bedrock` (for bedrock-runtime too).
"""

from __future__ import annotations

import hmac
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from adapters.cloud_targets import AwsCredentials

if TYPE_CHECKING:
    from botocore.auth import SigV4Auth

__all__ = ["SERVICE", "sign", "verify"]

SERVICE = "bedrock"
SIGV4_TIMESTAMP = "%Y%m%dT%H%M%SZ"  # botocore.auth's, without importing botocore for it
MAX_SKEW = timedelta(minutes=5)  # AWS refuses a request signed further from its clock than this
_AUTH = re.compile(r"^AWS4-HMAC-SHA256 Credential=([^/,\s]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                   r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$")


def _signer(creds: AwsCredentials, region: str) -> SigV4Auth:
    # Imported on first use: botocore is slow to import and only Bedrock deployments need it.
    from botocore.auth import SigV4Auth
    from botocore.credentials import ReadOnlyCredentials

    return SigV4Auth(ReadOnlyCredentials(creds.access_key, creds.secret_key, creds.session_token), SERVICE, region)


def sign(host: str, path: str, body: bytes, headers: dict[str, str], region: str,
         creds: AwsCredentials, method: str = "POST") -> dict[str, str]:
    """The headers to add: host, x-amz-date, authorization (and x-amz-security-token)."""
    from botocore.awsrequest import AWSRequest

    req = AWSRequest(method=method, url=f"https://{host}{path}", data=body, headers={**headers, "host": host})
    _signer(creds, region).add_auth(req)
    out = {"host": host, "x-amz-date": req.headers["X-Amz-Date"], "authorization": req.headers["Authorization"]}
    if creds.session_token:
        out["x-amz-security-token"] = creds.session_token
    return out


def verify(method: str, raw_path: str, headers: dict[str, str], body: bytes, *, region: str,
           creds: AwsCredentials, now: datetime | None = None) -> str | None:
    """Why the signature is refused, as AWS words it; None when it is good (the demo upstream)."""
    h = {k.lower(): v for k, v in headers.items()}
    m = _AUTH.match(h.get("authorization", ""))
    if m is None:
        return "Authorization header requires a valid AWS4-HMAC-SHA256 signature"
    key_id, day, scope_region, service, signed, signature = m.groups()
    if key_id != creds.access_key:
        return "The security token included in the request is invalid."
    if scope_region != region or service != SERVICE:
        return f"Credential should be scoped to a valid region and service {SERVICE}"
    stamp = h.get("x-amz-date", "")
    try:
        when = datetime.strptime(stamp, SIGV4_TIMESTAMP).replace(tzinfo=UTC)
    except ValueError:
        return "X-Amz-Date is missing or malformed"
    if abs((now or datetime.now(UTC)) - when) > MAX_SKEW or stamp[:8] != day:
        return "Signature expired: the request time is too far from the server time"
    if creds.session_token and h.get("x-amz-security-token") != creds.session_token:
        return "The security token included in the request is invalid."
    names = signed.split(";")
    if "host" not in names or any(n not in h for n in names):
        return "SignedHeaders must name host and only headers the request has"
    from botocore.awsrequest import AWSRequest

    req = AWSRequest(method=method, url=f"https://{h['host']}{raw_path}", data=body,
                     headers={n: h[n] for n in names})
    req.context["timestamp"] = stamp
    auth = _signer(creds, region)
    expected = auth.signature(auth.string_to_sign(req, auth.canonical_request(req)), req)
    if not hmac.compare_digest(expected, signature):
        return "The request signature we calculated does not match the signature you provided."
    return None

"""An S3-compatible server nobody here wrote, for the S3 file store's tests: moto's server (PyPI
`moto[server]`, in the dev extra), with IAM checks on, so every request must carry a SigV4 signature
made with a key moto issued (a wrong secret is `SignatureDoesNotMatch`, 403). Its first four
actions run unauthenticated: the user, its policy and key, and the bucket are made with them.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.stack_config import free_port


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str
    access_key: str
    secret_key: str

    def client(self):  # botocore's own S3 client: the test's independent view of the bucket
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key)

    def object_keys(self) -> list[str]:
        return [o["Key"] for o in self.client().list_objects_v2(Bucket=self.bucket).get("Contents", [])]


@contextlib.contextmanager
def moto_s3(bucket: str = "modelyard-files") -> Iterator[S3Server]:
    import botocore.session

    port = free_port()
    server = Path(sys.executable).with_name("moto_server")
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4"}
    proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.05)
        endpoint = f"http://127.0.0.1:{port}"
        session = botocore.session.get_session()
        iam = session.create_client("iam", endpoint_url=endpoint, region_name="us-east-1",
                                    aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="modelyard")
        iam.put_user_policy(UserName="modelyard", PolicyName="files", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="modelyard")["AccessKey"]
        s3 = S3Server(endpoint, bucket, key["AccessKeyId"], key["SecretAccessKey"])
        s3.client().create_bucket(Bucket=bucket)
        yield s3
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

"""A real S3-API server for tests: moto's ThreadedMotoServer on 127.0.0.1 with a random port.

It counts the requests it answers (tests bound them) and can be told to throttle (503 SlowDown) or to deny
writes (403 AccessDenied), as a real object store does under load or with a read-only token, or to answer late
(`delay_s`) or not for a while (`hang_s`), as a slow proxy or a dead link does. `stop()` also
closes the listening socket, so clients see a refused connection, not a hang.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import boto3
from moto.server import DomainDispatcherApplication, ThreadedMotoServer, create_backend_app
from werkzeug.serving import make_server

ACCESS_KEY = "AKIAEPBUILDTESTKEY77"
SECRET_KEY = "epbuild-test-secret-do-not-print-5b1f"
logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
ERROR = '<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message></Error>'


class S3Server(ThreadedMotoServer):
    def __init__(self, max_requests: int = 5000):
        super().__init__(ip_address="127.0.0.1", port=0, verbose=False)
        self.requests = 0
        self.writes = 0
        self.max_requests = max_requests
        self.throttle = False
        self.deny_writes = False
        self.delay_s = 0.0  # every answer this late, as behind a slow proxy or link
        self.hang_s = 0.0  # no answer at all for this long (bounded: the server must still stop)
        self._count_lock = threading.Lock()

    def _answer(self, environ: dict[str, Any], start_response: Any) -> Any:
        writing = environ["REQUEST_METHOD"] in ("PUT", "POST", "DELETE")
        with self._count_lock:
            self.requests += 1
            self.writes += writing
            over = self.requests > self.max_requests
        if self.hang_s or self.delay_s:
            time.sleep(self.hang_s or self.delay_s)
        if self.throttle or over:
            return self._error(start_response, "503 Slow Down", "SlowDown", "Please reduce your request rate.")
        if self.deny_writes and writing:
            return self._error(start_response, "403 Forbidden", "AccessDenied", "Access Denied")
        return self._app(environ, start_response)

    @staticmethod
    def _error(start_response: Any, status: str, code: str, message: str) -> list[bytes]:
        body = ERROR.format(code=code, message=message).encode()
        start_response(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]

    def _server_entry(self) -> None:
        self._app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server(self._ip_address, self._port, self._answer, True)
        self._server_ready_event.set()
        self._server.serve_forever()

    def stop(self) -> None:
        if self._server is not None and self._server_ready_event.is_set():
            super().stop()
            self._server.server_close()

    @property
    def endpoint(self) -> str:
        host, port = self.get_host_and_port()
        return f"http://{host}:{port}"

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)

    def new_bucket(self) -> str:
        """A bucket of its own per test: moto's state is shared by every server in this process."""
        name = f"epbuild-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def env(self) -> dict[str, str]:
        """The standard AWS settings a user would export, isolated from any ~/.aws of the machine."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}

    def objects(self, bucket: str) -> dict[str, str]:
        """Every key with its ETag."""
        found = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket):
            found.update({item["Key"]: item["ETag"] for item in page.get("Contents", [])})
        return found

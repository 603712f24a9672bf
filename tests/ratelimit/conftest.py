import os

import pytest

from .redis_server import REDIS_BIN, RedisServer


@pytest.fixture
def redis_server():
    if not os.path.exists(REDIS_BIN):
        pytest.skip("redis-server not installed")
    srv = RedisServer()
    srv.start()
    yield srv
    srv.stop()

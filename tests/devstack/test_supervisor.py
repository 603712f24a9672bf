"""The supervisor's decisions on cheap real processes (a sleeping Python) and a fake clock."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.child import Child, Role
from devstack.supervisor import Backoff, Supervisor
from tests.stack_config import free_port

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _child(name: str, role: Role = "auxiliary") -> Child:
    # Ready as soon as it runs: nothing listens on the port, so is_ready is patched per test.
    return Child(name, SLEEPER, ("tcp", f"127.0.0.1:{free_port()}"), role=role)


@pytest.fixture
def children(tmp_path: Path) -> Iterator[list[Child]]:
    kids = [_child("demo@1"), _child("extproc", "replica"), _child("extproc-2", "replica"),
            _child("envoy", "essential")]
    for c in kids:
        c.spawn(tmp_path)
    yield kids
    for c in kids:
        if c.proc and c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait()


def _kill(child: Child) -> None:
    assert child.proc is not None
    child.proc.kill()
    child.proc.wait()


def _sup(children: list[Child], tmp_path: Path, clock: Clock, lines: list[str]) -> Supervisor:
    return Supervisor(children, tmp_path, backoff=Backoff(initial=0.5, cap=2.0, stable_s=10.0),
                      log=lines.append, clock=clock)


def test_a_dead_auxiliary_child_restarts_after_its_backoff(children, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(Child, "is_ready", lambda self: True)
    clock, lines = Clock(), []
    sup = _sup(children, tmp_path, clock, lines)
    demo = children[0]
    old = demo.proc.pid
    _kill(demo)
    assert sup.tick() is None
    assert lines == [f"modelyard: demo@1 exited with code -9 (log {tmp_path / 'demo-1.log'}); restarting in 0.5s"]
    clock.now += 0.4
    assert sup.tick() is None and demo.proc.pid == old  # still waiting
    clock.now += 0.1
    assert sup.tick() is None and demo.proc.pid != old and demo.exit_code() is None
    assert sup.tick() is None
    assert lines[-1] == f"modelyard: demo@1 restarted (pid {demo.proc.pid}) and ready"


def test_backoff_doubles_to_the_cap_and_resets_after_a_stable_run(children, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(Child, "is_ready", lambda self: True)
    clock, lines = Clock(), []
    sup = _sup(children, tmp_path, clock, lines)
    demo = children[0]
    delays = []
    for _ in range(4):  # each run dies at once
        _kill(demo)
        sup.tick()
        delays.append(lines[-1].rsplit(" ", 1)[1])
        clock.now += 5
        sup.tick()  # respawned
        sup.tick()  # ready
    assert delays == ["0.5s", "1s", "2s", "2s"]
    clock.now += 10  # up for stable_s: a rare crash, not a loop
    _kill(demo)
    sup.tick()
    assert lines[-1].endswith("restarting in 0.5s")


def test_envoy_dying_stops_the_stack(children, tmp_path) -> None:
    lines: list[str] = []
    sup = _sup(children, tmp_path, Clock(), lines)
    _kill(children[3])
    why = sup.tick()
    assert why == f"envoy exited with code -9 (log {tmp_path / 'envoy.log'}); the stack cannot serve without it"
    assert lines == [f"modelyard: {why}; stopping"]


def test_every_replica_dying_restarts_each_and_the_stack_serves_on(children, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(Child, "is_ready", lambda self: True)
    clock, lines = Clock(), []
    sup = _sup(children, tmp_path, clock, lines)
    first, second = children[1], children[2]
    old = first.proc.pid, second.proc.pid
    _kill(first)
    assert sup.tick() is None
    _kill(second)  # the other one dies while the first waits for its restart: no replica is alive
    assert sup.tick() is None
    assert [ln.rsplit(";", 1)[1] for ln in lines] == [" restarting in 0.5s"] * 2
    clock.now += 0.5
    assert sup.tick() is None and sup.tick() is None
    assert (first.proc.pid, second.proc.pid) != old and first.exit_code() is None and second.exit_code() is None
    assert lines[-2:] == [f"modelyard: extproc restarted (pid {first.proc.pid}) and ready",
                          f"modelyard: extproc-2 restarted (pid {second.proc.pid}) and ready"]


def test_a_replica_that_cannot_start_stops_the_stack_and_says_why(children, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(Child, "is_ready", lambda self: False)
    clock, lines = Clock(), []
    sup = _sup(children, tmp_path, clock, lines)
    replica = children[1]
    replica.argv = [sys.executable, "-c", "import sys; print('ConfigError: models[0]: bad'); sys.exit(1)"]
    _kill(replica)  # it ran fine once; every start from now on fails at once
    why = None
    for _ in range(40):
        why = sup.tick()
        if why:
            break
        replica.proc is not None and replica.proc.wait()
        clock.now += 0.5
    assert why is not None and why.startswith("extproc exited with code 1 (log ")
    assert "it cannot start: 3 starts in a row exited before it was ready; its log ends:" in why
    assert why.endswith("    ConfigError: models[0]: bad")
    assert lines[-1] == f"modelyard: {why}\nmodelyard: stopping"
    # One death after a good run, then two failed starts, each waited out with a longer backoff.
    assert [ln.rsplit(" ", 1)[1] for ln in lines if "restarting in" in ln] == ["0.5s", "1s", "2s"]


def test_a_standby_takes_over_a_dead_replica_and_a_new_one_waits(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(Child, "is_ready", lambda self: True)
    replica = _child("extproc", "replica")
    # The standby waits for its line like `serve --standby`, then runs; EOF ends it.
    replica.standby_argv = [sys.executable, "-c", "import sys, time\nif sys.stdin.readline(): time.sleep(60)"]
    replica.spawn(tmp_path)
    clock, lines = Clock(), []
    sup = _sup([replica], tmp_path, clock, lines)
    try:
        assert sup.tick() is None and replica.standby is not None  # a spare once the replica serves
        standby = replica.standby.pid
        _kill(replica)
        sup.tick()
        clock.now += 0.5
        sup.tick()
        assert replica.proc.pid == standby and replica.standby is None
        assert lines[-1] == f"modelyard: extproc's standby took over (pid {standby})"
        assert replica.proc.poll() is None  # it got its line and runs
        sup.tick()  # ready; the next spare starts only now
        assert replica.standby is not None and replica.standby.pid != standby
        spare = replica.standby
        replica.stop_standby()
        assert spare.poll() is not None
    finally:
        replica.stop_standby()
        if replica.proc and replica.proc.poll() is None:
            replica.proc.kill()
            replica.proc.wait()


def test_run_returns_none_when_asked_to_stop(children, tmp_path) -> None:
    assert _sup(children, tmp_path, Clock(), []).run(lambda: True) is None


def test_a_standby_that_dies_on_its_own_is_not_respawned_at_once(tmp_path, monkeypatch) -> None:
    replica = _child("extproc", "replica")
    replica.standby_argv = [sys.executable, "-c", "raise SystemExit(3)"]  # a broken install, say
    replica.spawn_standby(tmp_path)
    first = replica.standby
    assert first is not None and first.wait(30) == 3
    replica.spawn_standby(tmp_path)
    assert replica.standby is first  # not a new process every tick
    monkeypatch.setattr("devstack.child.time.monotonic", lambda: replica.standby_started_at + 11)
    replica.spawn_standby(tmp_path)
    assert replica.standby is not first
    replica.stop_standby()

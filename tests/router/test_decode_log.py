"""The decode log's rate as SGLang's last_gen_throughput: the last full interval's tokens per
second of its own steps, 0 before any interval and once it is stale."""

from __future__ import annotations

from radixcluster.router import decode_log
from radixcluster.router.decode_log import GEN_THROUGHPUT_STALE_S, DecodeLog


def test_the_rate_is_the_last_intervals_until_it_is_stale(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(decode_log.time, "monotonic", lambda: now[0])
    log = DecodeLog(interval=2)
    log.stepped(batch=4, seconds=0.1, queued=0, pool_used=0.1)
    assert log.gen_throughput() == 0.0  # no full interval yet
    log.stepped(batch=4, seconds=0.1, queued=0, pool_used=0.1)
    assert log.gen_throughput() == 40.0  # 8 tokens in 0.2 s of steps
    log.stepped(batch=2, seconds=0.5, queued=0, pool_used=0.1)
    assert log.gen_throughput() == 40.0  # the next interval is not full
    now[0] += GEN_THROUGHPUT_STALE_S + 1
    assert log.gen_throughput() == 0.0  # decoding stopped

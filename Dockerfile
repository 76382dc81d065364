# syntax=docker/dockerfile:1
# The fluxnetes operator image: `docker build -t ghcr.io/fluxnetes/fluxnetes:0.1.0 .`
# Slim, non-root (uid 10001), and happy with a read-only root filesystem: Python writes no
# bytecode and nothing outside /tmp (an emptyDir in the chart).

FROM python:3.12-slim AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && pip wheel --wheel-dir /wheels "$(ls /wheels/fluxnetes-*.whl)"

FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels fluxnetes \
 && groupadd --gid 10001 fluxnetes \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin fluxnetes
USER 10001:10001
WORKDIR /tmp
# webhook (TLS) and metrics/health
EXPOSE 9443 8080
ENTRYPOINT ["fluxnetes", "run"]

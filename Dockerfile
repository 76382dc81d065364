# The fluxnetes operator image (docs/image.md):
#   docker build -t ghcr.io/fluxnetes/fluxnetes:0.1.0 .
#   bash hack/build-image.sh    # the same file, no container engine: a debootstrap base + buildah
# Slim (no compilers, no pip, no caches), non-root (uid 10001), and happy with a read-only root
# filesystem: Python writes no bytecode and nothing outside /tmp (an emptyDir in the chart).
# Plain Dockerfile syntax only (no RUN --mount), so that buildah 1.28 builds it as well.

# Any Debian-like image with python3 >= 3.11 and its venv module (ensurepip). The default is the
# official Python image; hack/build-image.sh passes a Debian bookworm root filesystem.
ARG BASE_IMAGE=python:3.12-slim

FROM ${BASE_IMAGE} AS build
# Only for builds behind a TLS-intercepting proxy (hack/build-image.sh mounts the CA bundle on
# /mnt): an argument of this stage, so it never reaches the final image.
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# A venv in both cases: Debian's own pip is "externally managed", and one layout for both bases.
RUN python3 -m venv /opt/fluxnetes
WORKDIR /src
# The dependencies first, from pyproject.toml alone: this layer survives changes to src/.
# Wheels only (--only-binary): the image has no compiler and must not need one. The bytecode
# is compiled here, as unchecked-hash .pyc: valid whatever the files' times after COPY, so a
# read-only root filesystem still starts fast and Python never tries to write any.
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > requirements.txt \
 && /opt/fluxnetes/bin/pip install --no-compile --only-binary=:all: -r requirements.txt \
 && /opt/fluxnetes/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/fluxnetes/lib
COPY README.md ./
COPY src ./src
# Then fluxnetes itself (compiled the same way); pip, and the setuptools of 3.11's venvs,
# leave the venv: nothing installs at run time.
RUN /opt/fluxnetes/bin/pip install --no-compile --no-deps . \
 && /opt/fluxnetes/bin/pip uninstall --yes --quiet pip setuptools \
 && /opt/fluxnetes/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash \
      /opt/fluxnetes/lib/python3*/site-packages/fluxnetes

FROM ${BASE_IMAGE}
ENV PATH=/opt/fluxnetes/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
COPY --from=build /opt/fluxnetes /opt/fluxnetes
# The runtime user owns nothing in the image; no setuid/setgid programs (su, mount, passwd...)
# are left for it to call.
RUN groupadd --gid 10001 fluxnetes \
 && useradd --uid 10001 --gid 10001 --no-create-home --no-log-init --home-dir /tmp \
      --shell /usr/sbin/nologin fluxnetes \
 && find / -xdev -type f -perm /6000 -exec chmod ug-s {} + \
 && fluxnetes --help > /dev/null
USER 10001:10001
WORKDIR /tmp
# webhook (TLS) and metrics/health
EXPOSE 9443 8080
ENTRYPOINT ["fluxnetes", "run"]

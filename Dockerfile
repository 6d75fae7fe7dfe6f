# syntax=docker/dockerfile:1
#
# The devplug image: devplug-nvidia by default; devplug-fake, devplug-nvidia labels and the
# devplug command are in it too (set the container's command).
#
#   docker build -t devplug:0.1.0 .
#   docker run --rm devplug:0.1.0 --help
#
# Stage 1 builds devplug's wheel and collects the wheels of its dependencies (the dra, nvidia
# and metrics extras included); stage 2 installs those wheels on a clean base, offline, and keeps
# nothing of the build. Every dependency ships binary wheels for linux/amd64 and linux/arm64,
# so neither stage needs a compiler.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY devplug ./devplug
COPY devplug_fake ./devplug_fake
COPY devplug_nvidia ./devplug_nvidia
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[dra,nvidia,metrics]"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="devplug" \
      org.opencontainers.image.description="Kubernetes device plugins: devplug-nvidia, devplug-fake" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
# NVIDIA_*: what the NVIDIA container runtime gives this container when it runs with
# runtimeClassName: nvidia: every GPU, and the driver's utility libraries (libnvidia-ml).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# The wheels are bind-mounted from the build stage, so they never become a layer; setuptools and
# wheel (build tools that the base image ships) go.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "devplug[dra,nvidia,metrics]" \
    && pip uninstall --yes setuptools wheel \
    && groupadd --system --gid 65532 devplug \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin devplug
# Not root by default. A device plugin writes its sockets into the kubelet's directories, which
# are root:root 0755 on the host, so the DaemonSets in deploy/ run it as uid 0 with every
# capability dropped; see docs/operator-guide.md.
USER 65532:65532
ENTRYPOINT ["devplug-nvidia"]

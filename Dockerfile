# The training image for this repository's experiments (built on every node by
# `higgsfield deploy`; its tag is a hash of this file, requirements.txt and the
# base image, so an unchanged image is never rebuilt).
#
#   docker build -t hf-higgsfield .                                 # CUDA PyTorch base
#   docker build --build-arg BASE_IMAGE=higgsfield-testbase:torch2.13 \
#                --build-arg INSTALL_REQUIREMENTS=false -t t .      # the offline test base
ARG BASE_IMAGE=pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime
FROM ${BASE_IMAGE}

ARG INSTALL_REQUIREMENTS=true
ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

WORKDIR /workspace
# Dependencies first: this layer stays cached while the code changes.
COPY requirements.txt /tmp/requirements.txt
RUN if [ "$INSTALL_REQUIREMENTS" = "true" ]; then python3 -m pip install --no-cache-dir -r /tmp/requirements.txt; fi

# The higgsfield package itself, from this checkout, so the image also runs on
# its own (`docker run IMAGE python -m torch.distributed.run ... -m
# higgsfield.node.entrypoint RUN_DIR`, as tests/test_dockerfile.py does). Under
# `higgsfield run` this copy is shadowed: every run mounts the node's invoker
# package (the exact build `higgsfield setup` installed) read-only at
# /opt/higgsfield-invoker, first on PYTHONPATH. A project from `higgsfield init`
# installs no higgsfield at all and relies on that mount alone.
COPY pyproject.toml README.md /opt/higgsfield-src/
COPY higgsfield /opt/higgsfield-src/higgsfield
COPY templates /opt/higgsfield-src/templates
RUN python3 -m pip install --no-cache-dir --no-deps --no-build-isolation /opt/higgsfield-src

COPY . /workspace

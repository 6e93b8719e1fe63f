# The training image for this repository's experiments (built on every node by
# `higgsfield deploy`; its tag is a hash of this file and requirements.txt, so an
# unchanged image is never rebuilt).
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

# The higgsfield package itself: this repo is its source. (A user project's
# Dockerfile, from `higgsfield init`, installs the wheel the invoker puts in
# .higgsfield-wheel/ instead, so the image matches the nodes' version.)
COPY pyproject.toml README.md /opt/higgsfield-src/
COPY higgsfield /opt/higgsfield-src/higgsfield
COPY templates /opt/higgsfield-src/templates
RUN python3 -m pip install --no-cache-dir --no-deps --no-build-isolation /opt/higgsfield-src

COPY . /workspace

# One image for `modelforge migrate`, `modelforge api` and `modelforge relay` (compose.yaml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Metadata first, so editing code does not invalidate more layers than needed.
COPY pyproject.toml README.md ./
COPY agent/ agent/
COPY api/ api/
COPY broker/ broker/
COPY cli/ cli/
COPY schemas/ schemas/
COPY stack/ stack/
COPY store/ store/
COPY workers/ workers/
# The server extra only: no embedded servers or test tools in the image.
RUN pip install '.[server]' \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin modelforge

# Run from a directory without the sources, so the installed package is what runs.
WORKDIR /
USER modelforge
EXPOSE 8080
CMD ["modelforge", "api"]

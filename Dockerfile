# syntax=docker/dockerfile:1
# tidal operator image: multi-stage, slim Python, non-root, runtime dependencies only.
#   docker build -t tidal:dev .          (then: kind load docker-image tidal:dev --name tidal)

FROM python:3.11-slim AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip==24.3.1 build==1.2.2
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN python -m build --wheel --outdir /dist

FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /dist/*.whl /tmp/
RUN pip install --no-cache-dir /tmp/*.whl && rm -f /tmp/*.whl \
    && groupadd --gid 65532 tidal && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin tidal
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["tidal"]
CMD ["run"]

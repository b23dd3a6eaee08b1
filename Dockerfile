# The tracejudge consumer image (docker-compose and deploy/k8s/ use it):
#   docker build -t tracejudge:0.1.0 .   then   docker run tracejudge:0.1.0 consume --help
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LITELLM_LOCAL_MODEL_COST_MAP=True
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY shared ./shared
COPY tracer ./tracer
COPY metrics ./metrics
COPY consumer ./consumer
COPY examples ./examples
RUN pip install --no-cache-dir ".[consumer,librdkafka]" \
    && useradd --create-home --uid 10001 tracejudge
USER 10001
EXPOSE 9464
HEALTHCHECK --interval=30s --timeout=5s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/metrics', timeout=3)"
ENTRYPOINT ["tracejudge"]
CMD ["consume"]

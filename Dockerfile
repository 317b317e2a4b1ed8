# voice_agent: the same install script as scripts/run, so there is one list of dependencies.
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 VOICE_AGENT_DATA_DIR=/data
WORKDIR /app
COPY pyproject.toml README.md ./
COPY scripts/ scripts/
COPY voice_agent/ voice_agent/
RUN bash -c 'source scripts/_env.sh && ensure_installed ""'
COPY config/ config/
RUN useradd --create-home --uid 10001 agent && mkdir -p /data && chown agent /data
USER agent
VOLUME ["/data"]
ENV OPENBLAS_NUM_THREADS=1
EXPOSE 8765
ENTRYPOINT ["/app/.venv/bin/voice-agent"]
# No access control yet (see the operations issue): publish the port only where you trust the network.
CMD ["serve", "--config", "config/agents.yaml", "--host", "0.0.0.0", "--port", "8765"]

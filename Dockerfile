# suturesim server image.
#
#   docker build -t suturesim .
#
# Networking and security. Inside a container, 127.0.0.1 is the container's own loopback. The default `serve`
# binds only there, so it cannot be reached through published ports. To be reachable, the endpoints must bind
# 0.0.0.0, and our policy refuses any non-loopback bind without ZeroMQ CURVE keys (docs/PROTOCOL.md, "Security").
# There are two ways to satisfy it:
#   1. CURVE (recommended). Make key pairs with `suturesim keys`, mount them read-only, and pass a config file
#      (see configs/server.yaml) that sets
#        endpoints: {pub: tcp://0.0.0.0:5555, control: tcp://0.0.0.0:5556, stylus: tcp://0.0.0.0:5557}
#        security: {server_secret_key: /keys/server.key_secret, client_keys_dir: /keys/clients}
#      The server refuses a secret key that group or others can read (mode 0600) and a client_keys_dir they can
#      write, and runs as uid 10001, which must own its secret key. On the host, for the server and one client:
#        suturesim keys --dir keys --name server && suturesim keys --dir mine --name alice
#        mkdir -p keys/clients && cp mine/alice.key keys/clients/ && sudo chown 10001 keys/server.key_secret
#      then run
#        docker run --rm -p 5555-5557:5555-5557 -v "$PWD/keys:/keys:ro" -v "$PWD/server.yaml:/config/server.yaml:ro" \
#          suturesim serve --config /config/server.yaml
#      Record and watch it from the host (or any machine that reaches the ports) with the client's pair; without
#      it they get nothing (record says so):
#        suturesim record --out session.mcap --connect tcp://HOST:5555 --control tcp://HOST:5556 \
#          --server-key keys/server.key --key mine/alice.key_secret
#        suturesim view --connect tcp://HOST:5555 --server-key keys/server.key --key mine/alice.key_secret
#      `serve --record F` (F on a mounted volume) records inside the container: the server's own recorder has a
#      key pair of its own, made at start and allowed by the server only.
#   2. `--insecure`, only on a trusted, isolated network. Anyone who can reach the ports can then control the
#      simulation, and the server prints a loud warning:
#        docker run --rm -p 5555-5557:5555-5557 suturesim serve --insecure \
#          --pub tcp://0.0.0.0:5555 --control tcp://0.0.0.0:5556 --stylus tcp://0.0.0.0:5557
#
# Real time. The 1 kHz loop asks for SCHED_FIFO and pins itself to a CPU. Docker drops CAP_SYS_NICE by default,
# so grant it back, and give the container CPUs of its own (ideally CPUs the host keeps other work off):
#   docker run --cap-add SYS_NICE --cpuset-cpus 2,3 ...
# Without these the server still runs, and the `stats` topic reports realtime=false.

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/var/cache/suturesim/numba

# A non-root user that owns the numba cache. It must be able to write there, because a host with a different
# CPU recompiles and adds to the cache. Without a writable NUMBA_CACHE_DIR, numba would look for the cache in
# another place and silently ignore the warm one.
RUN groupadd --system --gid 10001 suturesim \
    && useradd --system --uid 10001 --gid suturesim --create-home --home-dir /home/suturesim suturesim \
    && mkdir -p "$NUMBA_CACHE_DIR" \
    && chown -R suturesim:suturesim /var/cache/suturesim

WORKDIR /src
COPY pyproject.toml README.md ./
COPY solver ./solver
COPY haptics ./haptics
COPY server ./server
COPY tools ./tools
COPY configs ./configs
RUN pip install --no-cache-dir . && rm -rf /src

WORKDIR /home/suturesim
USER 10001:10001

# Warm the numba cache. One short headless run compiles and caches every solver kernel, so the server starts
# without compiling them first (seconds to a minute, depending on the machine). numba keys its cache on the CPU (model and feature flags). If the
# container runs on a host whose CPU differs from the build host's, the kernels are compiled again on first
# use and added to the cache. Building with NUMBA_CPU_NAME=generic would make the cache portable, at some
# speed cost.
RUN suturesim run bench-suture --duration 0.05

# 5555 PUB (state, force, stats, event), 5556 REP (control), 5557 PULL (remote stylus)
EXPOSE 5555 5556 5557

ENTRYPOINT ["suturesim"]
CMD ["serve"]

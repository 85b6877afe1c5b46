# The service image: build in a Rust image, run on a slim Debian.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p seckill

FROM debian:bookworm-slim
# No tools beyond what the service needs (its health check uses bash's
# /dev/tcp; ca-certificates for TLS to managed servers), and a user of its
# own: the service never runs as root. The user is named by number, so that
# a platform can check it is not root before starting the container
# (Kubernetes' `runAsNonRoot`).
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home \
       --shell /usr/sbin/nologin seckill
COPY --from=build /src/target/release/seckill /usr/local/bin/seckill
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["seckill"]
CMD ["serve"]

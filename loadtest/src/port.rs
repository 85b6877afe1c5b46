//! Free local ports for the processes the load test starts.

/// A port on 127.0.0.1 that was free a moment ago (the process it is meant
/// for binds it right after). Errors: no port could be bound.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

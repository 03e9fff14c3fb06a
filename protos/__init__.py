"""Wire contract (session_router.v1) and its generated modules; regenerate with protos/regen.sh."""

"""c2c inside vLLM: the KV connector (the one package of c2c that imports vLLM)."""

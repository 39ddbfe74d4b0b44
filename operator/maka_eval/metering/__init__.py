"""Metering: what the egress proxy observed of a subject's model work.

Standard library only (the relay bundle imports the checkpoint reader): the
provider-usage checkpoint and the one function that derives a figure from it
(checkpoint), model prices (pricing), the proxy's counting (meter), provider endpoints,
web-tool stripping and usage extraction (providers), server-sent events (sse).
"""

"""The dev stack: the launcher behind `modelyard up` and the demo upstreams it starts."""

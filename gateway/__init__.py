"""The gateway process: serves a replica's HTTP API in front of several replicas and sends each
request to one of them, chosen by what their radix trees hold (an exact view fed by the
routers' tree events) against how busy they are."""

"""The daemon process: wiring of every part and ONE config holder (main), the Unix
socket server and its limits (server), one handler per request (handlers), who is asking
(identity), notification hooks (hooks) and the Prometheus endpoint (metrics). The only
package that knows the socket; it never imports cli.
"""

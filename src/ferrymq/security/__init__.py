"""Security (issue 23): transport security (`tls*` modules) and access control.

Rule: this package sits below `ferrymq.rpc` (the remoting client and server build their TLS from
it) and above `ferrymq.wire`; it never imports a server.
"""

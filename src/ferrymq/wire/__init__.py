"""Sans-IO codecs: remoting frames, typed headers, message records, ids. No sockets, no clock."""

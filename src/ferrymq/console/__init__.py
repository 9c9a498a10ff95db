"""The web console (`ferry console`, issue 22): pages and a JSON API over the admin clients.

The console owns no state of the cluster: every number it shows is read, when asked, from the
same places `ferry admin` reads (the NameServers, the brokers' masters, the controllers, the
Connect REST API). What it keeps itself is only what it saw over time: recent samples for the
live charts (rates, lag) and the master changes it observed (recent elections).

`views` (pure: samples in, rates and elections out), `reader` (the admin reads and actions),
`app` (the FastAPI application: `/api/...` and the pages), `server` (uvicorn on a socket, the
sampling task).
"""

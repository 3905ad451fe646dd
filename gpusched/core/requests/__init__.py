"""The wire contract: the framing (protocol), every request type (base, catalog, views,
interactive), the sweep grammar a submit carries (sweep), the parsing of a frame into a
request (wire) and the typed replies (replies).

Empty on purpose: the CLI imports only the modules its command sends (`status` needs
protocol, base and views, never the whole catalog).
"""

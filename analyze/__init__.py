"""``laggard analyze``: read what was captured after an incident and name the culprit.

:mod:`~laggard.analyze.filetype` tells what each file is, the parsers in
:mod:`laggard.parsers` read it, the rules by domain (:mod:`~laggard.analyze.gpu`,
:mod:`~laggard.analyze.collectives`, :mod:`~laggard.analyze.network`) turn records into
findings, and :mod:`~laggard.analyze.cli` prints the report. Runs offline: never imports the
agent or torch.
"""

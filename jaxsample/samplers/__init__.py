"""The samplers, one per module: each holds its function, its chain stage and its candidate form.

========================  =========================================================================
module                    contents
========================  =========================================================================
``top_k``                 ``top_k``, ``TopK`` (an entry of the candidate fast path)
``top_p``                 ``top_p``, ``TopP`` (an entry)
``min_p``                 ``min_p``, ``MinP``
``typical``               ``typical``, ``Typical``
``top_n_sigma``           ``top_n_sigma``, ``TopNSigma``
``top_h``                 ``top_h``, ``TopH``
``epsilon_cutoff``        ``epsilon_cutoff``, ``EpsilonCutoff``
``eta_cutoff``            ``eta_cutoff``, ``EtaCutoff``
``p_less``                ``p_less``, ``PLess``
``xtc``                   ``xtc``, ``XTC``
``temperature``           ``temperature``, ``dynamic_temperature``, ``Temperature``, ``DynamicTemperature``
``greedy``                ``greedy``, ``Greedy`` (selector)
``categorical``           ``categorical``, ``Categorical`` (selector)
``mirostat``              ``mirostat``, ``mirostat_v2``, ``Mirostat``, ``MirostatV2`` (selectors)
``adaptive_p``            ``adaptive_p``, ``adaptive_p_init``, ``AdaptiveP`` (selector)
========================  =========================================================================

The functions are re-exported by :mod:`jaxsample`, the stages by :mod:`jaxsample.stages` under the
functions' names (``stages.top_p`` is ``TopP``). Each function validates its arguments and calls a
private core on NaN-free float32 logits; the stage calls the same core.
"""
